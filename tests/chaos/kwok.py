"""Jobs whose workers live on kwok fake nodes (hack/cluster/fake-nodes.sh): nothing runs, kwok
reports the pods Running at once and removes deleted ones at once. A worker "exits" when the
test writes into its pod status what a kubelet would write for that exit, and a deletion cut
in half is finished as a kubelet would finish it (finish_deletion)."""

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


# A pod deleted with grace 0 is two writes in the API server: deletionTimestamp set, then the
# object removed. A client killed between them (the operator, SIGKILLed in a DeleteCollection)
# leaves the pod terminating, for its kubelet to finish; kwok's stages leave grace-0 pods alone
# (kwok/stages.yaml: it deletes by name), so the test does it, by uid, as a kubelet does.
CUT_AFTER_SECONDS = 2.0


def finish_deletion(rest: Rest, namespace: str, pod: str, uid: str) -> bool:
    """Remove a terminating pod of uid `uid` (grace 0, uid precondition: never a successor of
    the same name); whether this call removed it."""
    answer = rest.request("DELETE", pods_path(namespace, pod),
                          {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                           "preconditions": {"uid": uid}})
    return answer.ok


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
