"""Kueue's admission, decided: the Workload a queued job needs, what Kueue's answer means for
its group, and the status writes Kueue expects from a job's controller (Kueue's
`pkg/controller/jobframework`, v0.17: a kind Kueue has no integration for creates its own
Workload, starts on `Admitted`, stops on `Evicted` and then clears the admission itself, and
reports `Finished`). Pure: reconcile/queueing.py makes the calls."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from multiworker.api.names import QUEUE_LABEL

Manifest = dict[str, Any]

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
GROUP_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS = "workloads"
PRIORITY_LABEL = f"{GROUP}/priority-class"  # a WorkloadPriorityClass
JOB_UID_LABEL = f"{GROUP}/job-uid"
FINALIZER = f"{GROUP}/resource-in-use"
POD_SET = "workers"
# Kueue's condition types on a Workload.
QUOTA_RESERVED, ADMITTED, EVICTED = "QuotaReserved", "Admitted", "Evicted"
PREEMPTED, REQUEUED, FINISHED = "Preempted", "Requeued", "Finished"
# Evictions after which Kueue queues the Workload again by itself (the rest, such as a
# deactivation, wait for a person).
_REQUEUED_AFTER = ("Preempted", "NodeFailures")


def workload_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{WORKLOADS}"
    return f"{path}/{name}" if name else path


def local_queue_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP_VERSION}/namespaces/{namespace}/localqueues/{name}"


def queue_name(labels: Mapping[str, str] | None) -> str | None:
    """The LocalQueue a job names; None: Kueue is not involved."""
    return (labels or {}).get(QUEUE_LABEL) or None


@dataclass(frozen=True)
class Priority:
    """Where a Workload's priority comes from: a WorkloadPriorityClass (the job's
    `kueue.x-k8s.io/priority-class` label) or the pod template's PriorityClass."""

    group: str
    kind: str
    name: str

    @property
    def path(self) -> str:
        if self.group == GROUP:
            return f"/apis/{GROUP_VERSION}/workloadpriorityclasses/{self.name}"
        return f"/apis/scheduling.k8s.io/v1/priorityclasses/{self.name}"


def priority_of(labels: Mapping[str, str] | None, template_spec: Mapping[str, Any]
                ) -> Priority | None:
    label = (labels or {}).get(PRIORITY_LABEL)
    if label:
        return Priority(GROUP, "WorkloadPriorityClass", label)
    pod_class = template_spec.get("priorityClassName")
    return Priority("scheduling.k8s.io", "PriorityClass", pod_class) if pod_class else None


def desired_workload(*, job: str, namespace: str, uid: str, owner: Manifest,
                     labels: Mapping[str, str], queue: str, workers: int,
                     template: Mapping[str, Any], priority: Priority | None,
                     priority_value: int | None, active: bool = True,
                     min_workers: int | None = None) -> Manifest:
    """The Workload of a job as it is now: one podSet of `workers` pods of the template (its
    requests, GPUs included, are what Kueue counts), of which Kueue may admit as few as
    `min_workers` (spec.elastic: Kueue's partial admission, podSet minCount). Its name
    carries a digest of what Kueue cannot change in place (podSets are immutable), so an
    edited job gets a new one; `active` False (a suspended job) keeps it out of the queue and
    Kueue evicts it if admitted."""
    metadata = template.get("metadata") or {}
    pod_set: Manifest = {"name": POD_SET, "count": workers, "template": {
        "metadata": {k: dict(v) for k in ("labels", "annotations")
                     if (v := metadata.get(k))},
        "spec": template["spec"]}}
    if min_workers is not None and min_workers < workers:
        pod_set["minCount"] = min_workers
    spec: Manifest = {"queueName": queue, "podSets": [pod_set]}
    if priority is not None:
        spec["priorityClassRef"] = {"group": priority.group, "kind": priority.kind,
                                    "name": priority.name}
        spec["priority"] = priority_value or 0
    name = workload_name(job, uid, spec)
    spec["active"] = active
    return {
        "apiVersion": GROUP_VERSION, "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**labels, JOB_UID_LABEL: uid},
                     "finalizers": [FINALIZER], "ownerReferences": [owner]},
        "spec": spec,
    }


def orphaned(workload: Manifest, job: Manifest | None) -> bool:
    """Whether a Workload holds our finalizer for a job that is gone, so no pass will ever
    let it go: being deleted (the garbage collector deletes a gone job's Workloads; a live
    job's is never deleted so, whatever a lagging job watch says) and no job of its name
    listed (`job`: as the synced cache has it)."""
    meta = workload.get("metadata") or {}
    return FINALIZER in (meta.get("finalizers") or []) and \
        bool(meta.get("deletionTimestamp")) and job is None


def is_active(workload: Manifest) -> bool:
    return (workload.get("spec") or {}).get("active", True) is not False


def workload_name(job: str, uid: str, spec: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps([uid, spec], sort_keys=True).encode()).hexdigest()[:10]
    return f"mwj-{job[:230]}-{digest}"


class Admission(StrEnum):
    PENDING = "Pending"  # waiting for quota (or for its admission checks)
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # must stop, then give the quota back
    FINISHED = "Finished"


@dataclass(frozen=True)
class QueueState:
    """What Kueue says about a Workload, in its own words."""

    admission: Admission
    reason: str
    message: str
    cluster_queue: str | None = None  # while it holds quota
    reserved: bool = False  # holds quota (an evicted one until we clear it)
    preempted: str | None = None  # Kueue's Preempted message: by whom, and why
    flavors: dict[str, str] = field(default_factory=dict)  # resource → ResourceFlavor
    admitted_workers: int | None = None  # the pods Kueue admitted (fewer: partial admission)


def _condition(workload: Manifest, type_: str) -> Manifest | None:
    return next((c for c in (workload.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), None)


def _true(workload: Manifest, type_: str) -> bool:
    found = _condition(workload, type_)
    return found is not None and found.get("status") == "True"


def read_workload(workload: Manifest) -> QueueState:
    status = workload.get("status") or {}
    admission = status.get("admission") or None
    reserved = admission is not None and _true(workload, QUOTA_RESERVED)
    cluster_queue = admission.get("clusterQueue") if admission else None
    flavors: dict[str, str] = {}
    admitted_workers = None
    for assignment in (admission or {}).get("podSetAssignments") or []:
        flavors |= assignment.get("flavors") or {}
        if assignment.get("name") == POD_SET and assignment.get("count") is not None:
            admitted_workers = int(assignment["count"])
    preempted = _condition(workload, PREEMPTED)
    by = preempted.get("message") if preempted and preempted.get("status") == "True" else None

    def state(kind: Admission, type_: str, default: str) -> QueueState:
        c = _condition(workload, type_) or {}
        return QueueState(kind, c.get("reason") or kind.value, c.get("message") or default,
                          cluster_queue, reserved, by, flavors, admitted_workers)

    if _true(workload, FINISHED):
        return state(Admission.FINISHED, FINISHED, "finished")
    if _true(workload, EVICTED) and admission is not None:
        return state(Admission.EVICTED, EVICTED, "evicted")  # until its quota is returned
    if reserved and _true(workload, ADMITTED):
        return state(Admission.ADMITTED, ADMITTED, "admitted")
    waiting = QUOTA_RESERVED if _condition(workload, QUOTA_RESERVED) else ADMITTED
    return state(Admission.PENDING, waiting, "waiting for Kueue to reserve quota")


def _set(conditions: list[Manifest], type_: str, status: str, reason: str, message: str,
         now: datetime, generation: int) -> list[Manifest]:
    old = next((c for c in conditions if c.get("type") == type_), None)
    moved = old is None or old.get("status") != status
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    new = {"type": type_, "status": status, "reason": reason, "message": message[:32768],
           "observedGeneration": generation,
           "lastTransitionTime": stamp if moved or old is None
           else old.get("lastTransitionTime", stamp)}
    return [*(c for c in conditions if c.get("type") != type_), new]


def quota_released(workload: Manifest, now: datetime) -> Manifest:
    """The status that gives an evicted Workload's quota back once its pods are gone:
    admission removed, QuotaReserved and Admitted False, and Requeued as Kueue's own job
    controllers set it (True after a preemption or a node failure: Kueue queues it again)."""
    status = dict(workload.get("status") or {})
    evicted = _condition(workload, EVICTED) or {}
    reason, message = evicted.get("reason") or "Evicted", evicted.get("message") or "evicted"
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    conditions = list(status.get("conditions") or [])
    conditions = _set(conditions, REQUEUED, "True" if reason in _REQUEUED_AFTER else "False",
                      reason, message, now, generation)
    conditions = _set(conditions, QUOTA_RESERVED, "False", "Pending", message, now, generation)
    conditions = _set(conditions, ADMITTED, "False", "NoReservation",
                      "The workload has no reservation", now, generation)
    status.pop("admission", None)
    return {**status, "conditions": conditions}


def finished(workload: Manifest, succeeded: bool, message: str, now: datetime) -> Manifest:
    status = dict(workload.get("status") or {})
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    status["conditions"] = _set(list(status.get("conditions") or []), FINISHED, "True",
                                "Succeeded" if succeeded else "Failed", message, now,
                                generation)
    return status


def pods_ready(workload: Manifest, ready: bool, now: datetime) -> Manifest | None:
    """The status saying whether the whole group runs (Kueue's waitForPodsReady reads it);
    None when it already says so."""
    want = "True" if ready else "False"
    found = _condition(workload, "PodsReady")
    if found is not None and found.get("status") == want:
        return None
    status = dict(workload.get("status") or {})
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    reason, message = (("PodsReady", "All workers are running") if ready
                       else ("PodsNotReady", "Not all workers are running"))
    status["conditions"] = _set(list(status.get("conditions") or []), "PodsReady", want,
                                reason, message, now, generation)
    return status


@dataclass(frozen=True)
class FlavorFields:
    """What the admitted flavors ask of every worker pod."""

    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Manifest, ...] = ()


def flavor_fields(flavors: Sequence[Manifest]) -> FlavorFields:
    """The node labels and tolerations of the ResourceFlavors a Workload was admitted with,
    merged (a flavor per resource; the same label from two flavors: the first wins)."""
    labels: dict[str, str] = {}
    tolerations: list[Manifest] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        for key, value in (spec.get("nodeLabels") or {}).items():
            labels.setdefault(key, value)
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return FlavorFields(labels, tuple(tolerations))


def with_flavor_fields(pod: Manifest, fields: FlavorFields) -> Manifest:
    spec = pod["spec"]
    if fields.node_labels:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **fields.node_labels}
    if fields.tolerations:
        held = list(spec.get("tolerations") or [])
        spec["tolerations"] = held + [t for t in fields.tolerations if t not in held]
    return pod


def on_flavor_nodes(node: Manifest, fields: FlavorFields) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in fields.node_labels.items())


def waiting_message(queue: str, state: QueueState) -> str:
    """What a queued job's condition says: where it waits and Kueue's own words."""
    where = f"LocalQueue {queue}"
    if state.cluster_queue:
        where += f" (ClusterQueue {state.cluster_queue})"
    return f"queued in {where}: {state.reason}: {state.message}"
