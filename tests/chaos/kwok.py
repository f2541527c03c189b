"""Jobs whose workers live on kwok fake nodes (hack/cluster/fake-nodes.sh): nothing runs, kwok
reports the pods Running at once and removes deleted ones at once. A worker "exits" when the
test writes into its pod status what a kubelet would write for that exit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.chaos.rest import MERGE, Rest, pods_path
from tests.integration.jobs import BASE, GROUP, VERSION

Obj = dict[str, Any]
KWOK_PLACEMENT: Obj = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": "multiworker.dev/fake-node", "operator": "Exists",
                     "effect": "NoSchedule"}],
}


def kwok_job(name: str, workers: int, **spec: Any) -> Obj:
    container = {"name": "tensorflow", "image": BASE, "command": ["sleep", "infinity"]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {"workers": workers,
                 "template": {"spec": {**KWOK_PLACEMENT, "containers": [container],
                                       # Deleted by the API server at once: kwok, which
                                       # deletes by name, never touches them (its stage
                                       # for graceful deletions: kwok/stages.yaml).
                                       "terminationGracePeriodSeconds": 0}},
                 **spec},
    }


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_worker(rest: Rest, namespace: str, pod: str, code: int) -> None:
    """Report the pod's containers as exited with `code`, as its kubelet would."""
    found = rest.call("GET", pods_path(namespace, pod))
    now = _now()
    started = (found.get("status") or {}).get("startTime") or now
    statuses = [{
        "name": c["name"], "image": c["image"], "imageID": "", "ready": False,
        "restartCount": 0, "started": False,
        "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0
                                 else "Error", "startedAt": started, "finishedAt": now}},
    } for c in found["spec"]["containers"]]
    body = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
            "status": {"phase": "Succeeded" if code == 0 else "Failed",
                       "containerStatuses": statuses}}
    rest.call("PATCH", pods_path(namespace, pod) + "/status", body, content_type=MERGE)
