"""Fluent builders for unit tests: jobs and pods as the API server would return them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from multiworker.api import names
from multiworker.api.job import Job
from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.api.status import JobStatus

JOB = "demo"
NAMESPACE = "ml"
JOB_UID = "uid-demo"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A moment `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def spec_dict(workers: int = 3, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workers": workers,
        "template": {
            "spec": {
                "containers": [{"name": "tensorflow", "image": "multiworker.local/worker:dev"}]
            }
        },
    }
    spec.update(overrides)
    return spec


def job_body(name: str = JOB, **spec_overrides: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": JOB_UID, "generation": 1,
                     "creationTimestamp": stamp(0)},
        "spec": spec_dict(**spec_overrides),
    }


def make_job(status: JobStatus | None = None, **spec_overrides: Any) -> Job:
    job = Job.from_body(job_body(**spec_overrides))
    if status is not None:
        job = Job(job.name, job.namespace, job.uid, job.generation, job.spec, status, job.created)
    return job


def make_spec(**overrides: Any) -> MultiWorkerJobSpec:
    return MultiWorkerJobSpec.model_validate(spec_dict(**overrides))


class PodBuilder:
    """`PodBuilder(1).running().build()`: worker 1 of generation 0, owned by the demo job."""

    def __init__(self, index: int, generation: int = 0, job: str = JOB, uid: str = JOB_UID):
        self.pod: dict[str, Any] = {
            "metadata": {
                "name": names.worker_name(job, index),
                "uid": f"pod-{index}-{generation}",
                "creationTimestamp": stamp(0),
                "labels": names.worker_labels(job, index, generation),
                "ownerReferences": [{"uid": uid, "controller": True, "kind": names.KIND}],
            },
            "status": {"phase": "Pending"},
        }

    def _trainer(self, state: dict[str, Any]) -> PodBuilder:
        self.pod["status"]["containerStatuses"] = [{"name": "tensorflow", "state": state}]
        self.pod["status"]["hostIP"] = "10.0.0.1"
        return self

    def created(self, seconds: float) -> PodBuilder:
        self.pod["metadata"]["creationTimestamp"] = stamp(seconds)
        return self

    def unschedulable(self, message: str) -> PodBuilder:
        self.pod["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message,
        }]
        return self

    def avoiding(self, *nodes: str) -> PodBuilder:
        """Created away from `nodes` (their Lease was silent then)."""
        annotations = self.pod["metadata"].setdefault("annotations", {})
        annotations[names.ANNOTATION_AVOIDED_NODES] = ",".join(nodes)
        return self

    def waiting(self, reason: str, message: str = "") -> PodBuilder:
        self.pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        return self._trainer({"waiting": {"reason": reason, "message": message}})

    def running(self, ready: bool = True) -> PodBuilder:
        self.pod["status"]["phase"] = "Running"
        self.pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
        return self._trainer({"running": {"startedAt": stamp(1)}})

    def exited(
        self, code: int, reason: str = "Error", message: str = "", finished: float = 10,
        started: float | None = None,
    ) -> PodBuilder:
        self.pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        terminated = {"exitCode": code, "reason": reason, "message": message,
                      "finishedAt": stamp(finished)}
        if started is not None:
            terminated["startedAt"] = stamp(started)
        return self._trainer({"terminated": terminated})

    def deleted(self, requested: float, grace: int = 30) -> PodBuilder:
        self.pod["metadata"]["deletionTimestamp"] = stamp(requested + grace)
        self.pod["metadata"]["deletionGracePeriodSeconds"] = grace
        return self

    def disruption_target(self, reason: str, message: str = "", when: float = 5) -> PodBuilder:
        conditions = self.pod["status"].setdefault("conditions", [])
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                           "message": message, "lastTransitionTime": stamp(when)})
        return self

    def evicted(self, message: str = "The node was low on resource: memory.") -> PodBuilder:
        self.pod["status"].update(phase="Failed", reason="Evicted", message=message)
        return self

    def scheduled(self, seconds: float) -> PodBuilder:
        """Bound to its node at T0 + `seconds` (PodScheduled's transition)."""
        for condition in self.pod["status"].setdefault("conditions", []):
            if condition["type"] == "PodScheduled":
                condition["lastTransitionTime"] = stamp(seconds)
        return self

    def on_node(self, node: str) -> PodBuilder:
        self.pod.setdefault("spec", {})["nodeName"] = node
        return self

    def owned_by(self, uid: str) -> PodBuilder:
        self.pod["metadata"]["ownerReferences"][0]["uid"] = uid
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self.pod)
