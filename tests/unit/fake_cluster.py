"""An in-memory ClusterIO for reconcile tests: objects as dicts, deletions you can complete.

Reads (job, pods, node) answer from memory like the controller's caches; writes change it."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from multiworker.api import names
from multiworker.clients.writes import (
    Conflict,
    Created,
    GenerationDeletion,
    Gone,
    PodDeletion,
    PodPatch,
    RefusalKind,
    Refused,
)
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS

from tests.unit.builders import T0

Manifest = dict[str, Any]


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeCluster:
    def __init__(self, job: Manifest) -> None:
        self.job: Manifest | None = copy.deepcopy(job)
        if self.job is not None:
            self.job["metadata"].setdefault("resourceVersion", "1")
        self.pods: dict[str, Manifest] = {}
        self.services: dict[str, Manifest] = {}
        self.events: list[tuple[str, str, str]] = []
        self.created_pods: list[str] = []
        self.patched_pods: list[PodPatch] = []
        self.generation_deletions: list[GenerationDeletion] = []
        self.now = T0
        self.reject_pods: str | None = None  # a message: the API server refuses pods
        self.refusal = RefusalKind.INVALID  # and how
        # The node running pods are bound to; a pod on a node missing here is on a lost node.
        self.nodes: dict[str, Manifest] = {"node-1": {
            "metadata": {"name": "node-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}
        self.live_nodes: dict[str, Manifest] = {}  # nodes as the API has them now, if newer
        self.node_reads: list[str] = []
        self.silences: dict[str, float] = {}  # seconds since a node's Lease was seen renewed
        self.renewed_in_api: set[str] = set()  # Leases renewed that the watch has not shown
        self.lease_reads: list[str] = []
        self.objects: dict[str, Manifest] = {}  # PodGroups, by name
        self.served = True  # the PodGroup API (and Kueue's)
        self.workloads: dict[str, Manifest] = {}  # Kueue Workloads, by name
        self.workloads_listed = True  # their watch has listed them
        self.fail_status_writes = 0
        self.fail_events = 0  # the next N Event POSTs raise
        self.serve_once: Manifest | None = None  # an outdated read, served once
        self._uids = 0
        self.others: list[Manifest] = []  # pods of no job of ours (pods_on_node)
        self.pods_on_node_forbidden = False

    # --- ClusterIO ---

    def cached_job(self, namespace: str, name: str) -> Manifest | None:
        served, self.serve_once = self.serve_once, None
        return copy.deepcopy(served or self.job)

    def cached_node(self, name: str) -> Manifest | None:
        return copy.deepcopy(self.nodes.get(name))

    def get_node(self, name: str) -> Manifest | None:
        """The API's answer; `live_nodes` stages a node the cache (`nodes`) has not caught up
        with."""
        self.node_reads.append(name)
        return copy.deepcopy(self.live_nodes.get(name, self.nodes.get(name)))

    def heartbeat_silence(self, node: str) -> float | None:
        return self.silences.get(node)

    def reread_lease(self, node: str) -> None:
        """The API's Lease: one in `renewed_in_api` was renewed although the watch is silent."""
        self.lease_reads.append(node)
        if node in self.renewed_in_api:
            self.silences[node] = 0.0

    def silent_nodes(self) -> set[str]:
        return {node for node, seconds in self.silences.items()
                if seconds >= STALE_HEARTBEAT_SECONDS}

    def cached_all_pods(self) -> list[Manifest]:
        return [copy.deepcopy(p) for p in self.pods.values()]

    def pods_on_node(self, node: str) -> list[Manifest] | None:
        """The API's list of every pod on `node` (the job's and `others`); None: forbidden."""
        if self.pods_on_node_forbidden:
            return None
        return [copy.deepcopy(p) for p in [*self.pods.values(), *self.others]
                if (p.get("spec") or {}).get("nodeName") == node]

    def api_served(self, group_version: str, plural: str) -> bool:
        return self.served

    def create_object(self, path: str, manifest: Manifest) -> Created:
        name = manifest["metadata"]["name"]
        if path.endswith("/workloads"):
            if name in self.workloads:
                return Created.EXISTS
            self._uids += 1
            self.workloads[name] = {**copy.deepcopy(manifest), "metadata": {
                **copy.deepcopy(manifest["metadata"]), "resourceVersion": "1",
                "generation": 1, "uid": f"wl-{self._uids}"}}
            return Created.CREATED
        if name in self.objects:
            return Created.EXISTS
        self.objects[name] = copy.deepcopy(manifest)
        return Created.CREATED

    def get_object(self, path: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(path.rsplit("/", 1)[-1]))

    def delete_object(self, path: str) -> None:
        store = self.workloads if "/workloads/" in path else self.objects
        store.pop(path.rsplit("/", 1)[-1], None)

    def cached_workloads(self, namespace: str, job: str) -> list[Manifest] | None:
        if not self.workloads_listed:
            return None
        return [copy.deepcopy(w) for w in self.workloads.values()
                if w["metadata"]["labels"].get(names.LABEL_JOB_NAME) == job]

    def _workload(self, path: str, obj: Manifest) -> Manifest:
        held = self.workloads.get(path.rsplit("/", 1)[-1])
        if held is None:
            raise Gone(path)
        if held["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict(path)
        held["metadata"]["resourceVersion"] = str(int(held["metadata"]["resourceVersion"]) + 1)
        return held

    def replace_status(self, path: str, obj: Manifest, status: Manifest) -> Manifest:
        held = self._workload(path, obj)
        held["status"] = copy.deepcopy(status)
        return copy.deepcopy(held)

    def patch_object(self, path: str, patch: Manifest) -> None:
        held = self.workloads.get(path.rsplit("/", 1)[-1])
        if held is not None:
            for key, value in patch.items():
                held[key] = {**held.get(key, {}), **value}
            held["metadata"]["resourceVersion"] = str(
                int(held["metadata"]["resourceVersion"]) + 1)

    def drop_finalizer(self, path: str, obj: Manifest, finalizer: str) -> None:
        held = self._workload(path, obj)
        held["metadata"]["finalizers"] = [
            f for f in held["metadata"].get("finalizers") or [] if f != finalizer]

    def cached_nodes(self) -> list[Manifest]:
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> str:
        if self.fail_status_writes:
            self.fail_status_writes -= 1
            raise RuntimeError("injected status write failure")
        assert self.job is not None
        if resource_version != self.job["metadata"]["resourceVersion"]:
            raise Conflict("changed")
        merged = {**self.job.get("status", {}), **status}
        self.job["status"] = {k: v for k, v in merged.items() if v is not None}
        self._bump()
        return str(self.job["metadata"]["resourceVersion"])

    def _bump(self) -> None:
        assert self.job is not None
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self.job = None

    def cached_pods(self, namespace: str, job: str) -> list[Manifest]:
        return [copy.deepcopy(p) for p in self.pods.values()
                if p["metadata"]["labels"].get(names.LABEL_JOB_NAME) == job]

    def get_pod(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.pods.get(name))

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.services.get(name))

    def create_pods(self, pods: Sequence[Manifest]) -> list[Created | Refused]:
        return [self.create_pod(pod) for pod in pods]

    def create_pod(self, pod: Manifest) -> Created | Refused:
        if self.reject_pods:
            return Refused(self.refusal, self.reject_pods)
        name = pod["metadata"]["name"]
        if name in self.pods:
            return Created.EXISTS
        self._uids += 1
        stored = copy.deepcopy(pod)
        stored["metadata"].update(uid=f"pod-uid-{self._uids}", creationTimestamp=_stamp(self.now))
        stored["status"] = {"phase": "Pending"}
        self.pods[name] = stored
        self.created_pods.append(name)
        return Created.CREATED

    def create_service(self, service: Manifest) -> Created:
        name = service["metadata"]["name"]
        if name in self.services:
            return Created.EXISTS
        self.services[name] = copy.deepcopy(service)
        return Created.CREATED

    def patch_pods(self, patches: Sequence[PodPatch]) -> list[bool]:
        done = []
        for patch in patches:
            pod = self.pods.get(patch.name)
            ok = pod is not None and pod["metadata"]["uid"] == patch.uid
            if ok:
                meta = pod["metadata"]
                meta["labels"] = {**meta.get("labels", {}), **patch.labels}
                meta["annotations"] = {**meta.get("annotations", {}), **patch.annotations}
                self.patched_pods.append(patch)
            done.append(ok)
        return done

    def delete_pods(self, deletions: Sequence[PodDeletion]) -> None:
        for d in deletions:
            self.delete_pod(d.namespace, d.name, d.uid, d.grace)

    def delete_generation(self, deletion: GenerationDeletion) -> None:
        """As the API server's DeleteCollection: every pod with the labels, but the spared."""
        self.generation_deletions.append(deletion)
        indexes = {str(i) for i in deletion.indexes}
        for name, pod in list(self.pods.items()):
            labels = pod["metadata"].get("labels", {})
            if (labels.get(names.LABEL_JOB_NAME) == deletion.job
                    and labels.get(names.LABEL_GROUP_GENERATION) == str(deletion.generation)
                    and labels.get(names.LABEL_WORKER_INDEX) in indexes
                    and name not in deletion.spared):
                self.delete_pod(deletion.namespace, name, pod["metadata"]["uid"], deletion.grace)

    def delete_pod(self, namespace: str, name: str, uid: str, grace: int | None = None) -> None:
        pod = self.pods.get(name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if grace == 0:
            del self.pods[name]
            return
        seconds = 30 if grace is None else grace
        pod["metadata"].setdefault("deletionTimestamp",
                                   _stamp(self.now + timedelta(seconds=seconds)))
        pod["metadata"].setdefault("deletionGracePeriodSeconds", seconds)

    def emit_event(
        self, job: Manifest, type_: str, reason: str, message: str, now: datetime
    ) -> None:
        if self.fail_events:
            self.fail_events -= 1
            raise RuntimeError("injected Event POST failure")
        self.events.append((type_, reason, message))

    # --- what the kubelet and users do ---

    def finish_deletions(self) -> None:
        for name in [n for n, p in self.pods.items() if "deletionTimestamp" in p["metadata"]]:
            del self.pods[name]

    def run(self, *indexes: int) -> None:
        for i in indexes or range(len(self.pods)):
            pod = self.pods[names.worker_name(self.job_name, i)]
            pod["spec"]["nodeName"] = "node-1"
            pod["status"] = {
                "phase": "Running", "hostIP": "10.0.0.1", "podIP": f"10.88.0.{10 + i}",
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "tensorflow", "state": {"running": {}}}],
            }

    def exit(self, index: int, code: int, reason: str = "Error", message: str = "",
             sidecar: bool = False) -> None:
        """The trainer exits; with `sidecar`, a classic sidecar container keeps the pod
        Running (what a log shipper or istio-proxy does)."""
        pod = self.pods[names.worker_name(self.job_name, index)]
        pod["status"]["phase"] = "Running" if sidecar else "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [{"name": "tensorflow", "state": {"terminated": {
            "exitCode": code, "reason": reason, "message": message,
            "finishedAt": _stamp(self.now)}}}]
        if sidecar:
            pod["status"]["containerStatuses"].append({"name": "log-shipper",
                                                       "state": {"running": {}}})

    def unschedulable(self, index: int, message: str) -> None:
        pod = self.pods[names.worker_name(self.job_name, index)]
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable", "message": message}]

    def user_deletes(self, index: int) -> None:
        pod = self.pods[names.worker_name(self.job_name, index)]
        self.delete_pod("", pod["metadata"]["name"], pod["metadata"]["uid"])

    def set_spec(self, **changes: Any) -> None:
        assert self.job is not None
        self.job["spec"].update(changes)
        self.job["metadata"]["generation"] += 1
        self._bump()

    @property
    def job_name(self) -> str:
        assert self.job is not None
        return str(self.job["metadata"]["name"])

    @property
    def status(self) -> Manifest:
        assert self.job is not None
        return dict(self.job.get("status", {}))

    def generations(self) -> dict[str, str]:
        return {n: p["metadata"]["labels"][names.LABEL_GROUP_GENERATION]
                for n, p in sorted(self.pods.items())}
