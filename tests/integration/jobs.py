"""Building MultiWorkerJobs for tests and reading back what the operator made of them."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from kubernetes import client

from tests.cluster import Cluster
from tests.support import wait_for

BASE = "multiworker.local/base:bookworm"
GROUP, VERSION, PLURAL = "multiworker.dev", "v1alpha1", "multiworkerjobs"
Obj = dict[str, Any]


def job(name: str, script: str, workers: int = 3, **spec: Any) -> Obj:
    """A job whose workers run `sh -c script` in the base image (no TensorFlow here).

    Scripts see the operator's environment, e.g. `$MWJ_WORKER_INDEX` and `$MWJ_RESTART_COUNT`,
    so one worker of one generation can be told to fail.
    """
    container = {
        "name": "tensorflow",
        "image": BASE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", textwrap.dedent(script).strip()],
    }
    template = {"spec": {"terminationGracePeriodSeconds": 1, "containers": [container]}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {"workers": workers, "template": template, **spec},
    }


def fail_once(index: int, code: int, after: float = 1) -> str:
    """Worker `index` of the first group exits `code`; everyone else sleeps."""
    return f"""
        if [ "$MWJ_WORKER_INDEX" = {index} ] && [ "$MWJ_RESTART_COUNT" = 0 ]; then
          sleep {after}; exit {code}
        fi
        exec sleep 3600
    """


class Jobs:
    """The jobs of one test namespace: apply with kubectl, read with the API client."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        api = cluster.api_client()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.cluster.kubectl("-n", self.namespace, *args, **kwargs)

    def apply(self, manifest: Obj, check: bool = True) -> Any:
        return self.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=check)

    def patch_spec(self, name: str, **spec: Any) -> None:
        self.kubectl("patch", "mwj", name, "--type=merge", "-p", json.dumps({"spec": spec}))

    def get(self, name: str) -> Obj | None:
        try:
            found: Obj = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return found

    def status(self, name: str) -> Obj:
        found = self.get(name)
        return dict(found.get("status") or {}) if found else {}

    def pods(self, name: str) -> list[Obj]:
        response = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"multiworker.dev/job-name={name}",
            _preload_content=False)
        items: list[Obj] = json.loads(response.data)["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def events(self, name: str) -> list[tuple[str, str, str]]:
        found = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}")
        ordered = sorted(found.items, key=lambda e: (e.first_timestamp, e.metadata.name))
        return [(e.type, e.reason, e.message) for e in ordered]

    def wait_event(self, name: str, type_: str, reason: str, timeout: float = 30) -> None:
        """Until job `name` has an Event of this type and reason: the operator records Events
        after its status write, so a condition can be seen before its Event."""
        wait_for(lambda: (type_, reason) in {(t, r) for t, r, _ in self.events(name)}, timeout,
                 describe=lambda: f"a {type_} {reason} Event: {self.events(name)}")

    def describe(self, name: str) -> str:
        status = json.dumps(self.status(name), indent=1)
        pods = self.kubectl("get", "pods", "-o", "wide", "-L",
                            "multiworker.dev/group-generation", check=False).stdout
        return f"job {name} status:\n{status}\npods:\n{pods}\nevents: {self.events(name)}"

    def wait(self, name: str, what: str, check: Any, timeout: float = 90) -> Any:
        """Poll `check(status)` until truthy; on timeout show status, pods and events."""
        return wait_for(lambda: check(self.status(name)), timeout,
                        describe=lambda: f"{what}\n{self.describe(name)}")

    def wait_phase(self, name: str, phase: str, timeout: float = 90) -> Obj:
        """Until the job is in `phase`; fails at once if it ends in another (it stays there)."""
        def reached(status: Obj) -> Obj | None:
            if status.get("phase") in TERMINAL and status.get("phase") != phase:
                raise AssertionError(f"phase {phase} wanted, the job ended {status['phase']}\n"
                                     f"{self.describe(name)}")
            return status if status.get("phase") == phase else None
        result: Obj = self.wait(name, f"phase {phase}", reached, timeout)
        return result

    def wait_running(self, name: str, generation: int = 0, timeout: float = 90) -> Obj:
        result: Obj = self.wait(
            name, f"generation {generation} running",
            lambda s: s if s.get("phase") == "Running"
            and s.get("groupGeneration") == generation else None, timeout)
        return result


TERMINAL = ("Succeeded", "Failed")


def condition(status: Obj, type_: str) -> Obj | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def env_of(pod: Obj) -> dict[str, str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "tensorflow")
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def generation_of(pod: Obj) -> int:
    return int(pod["metadata"]["labels"]["multiworker.dev/group-generation"])
