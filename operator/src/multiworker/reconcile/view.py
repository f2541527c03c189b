"""What a reconcile pass sees: the watch-fed caches for reads — with the operator's own latest
status write laid over a job the cache has not caught up with yet — and the API server for
writes. The controller hands one View to every pass (context.ClusterIO)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from multiworker.clients.heartbeats import Heartbeats, slim_lease
from multiworker.clients.informer import Key, Store
from multiworker.clients.kube import Cluster
from multiworker.clients.writes import Created, GenerationDeletion, PodDeletion, PodPatch, Refused
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS

Manifest = dict[str, Any]


@dataclass
class View:
    """What a pass reads (caches, with our own latest status write laid over a job the cache
    has not caught up with) and writes (the API server)."""

    cluster: Cluster
    job_store: Store
    pod_store: Store
    node_store: Store
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    # Kueue Workloads by job (--kueue), and whether their first list has arrived.
    workload_store: Store = field(default_factory=Store)
    workloads_synced: list[threading.Event] = field(default_factory=list)
    # Our latest status write of a job, and every version our writes replaced since the cache
    # last caught up: two quick writes leave the cache two versions behind, and it must not
    # read as news (a pass on it would write against a stale version and loop on 409s).
    written: dict[Key, tuple[frozenset[str], Manifest]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cached_job(self, namespace: str, name: str) -> Manifest | None:
        cached = self.job_store.get((namespace, name))
        with self._lock:
            ours = self.written.get((namespace, name))
            if ours is None or cached is None:
                return cached
            if cached["metadata"].get("resourceVersion") in ours[0]:
                return ours[1]  # the cache still shows a version our writes replaced
            del self.written[(namespace, name)]
        return cached

    def remember_write(self, key: Key, read_version: str, body: Manifest) -> None:
        """Until the cache shows a version none of our writes replaced, passes read `body`."""
        with self._lock:
            earlier = self.written.get(key)
            replaced = earlier[0] if earlier is not None else frozenset()
            self.written[key] = (replaced | {read_version}, body)

    def forget(self, key: Key) -> None:
        with self._lock:
            self.written.pop(key, None)

    def cached_pods(self, namespace: str, job: str) -> list[Manifest]:
        return self.pod_store.by_index((namespace, job))

    def cached_node(self, name: str) -> Manifest | None:
        return self.node_store.get(("", name))

    def cached_workloads(self, namespace: str, job: str) -> list[Manifest] | None:
        """The job's Kueue Workloads; None until their watch has listed them (or without
        --kueue)."""
        if not self.workloads_synced or not all(e.is_set() for e in self.workloads_synced):
            return None
        return self.workload_store.by_index((namespace, job))

    def cached_all_pods(self) -> list[Manifest]:
        """Every pod the operator watches (all jobs'): who holds what, for placement
        messages."""
        return [pod for key in self.pod_store if (pod := self.pod_store.get(key))]

    def cached_nodes(self) -> list[Manifest]:
        return [node for key in self.node_store if (node := self.node_store.get(key))]

    def heartbeat_silence(self, node: str) -> float | None:
        return self.heartbeats.silence(node)

    def reread_lease(self, node: str) -> None:
        """Reads the node's Lease from the API: a renewal the watch has not delivered (it
        lags, or stalled) counts before a silence is acted on."""
        lease = self.cluster.get_node_lease(node)
        if lease is not None:
            self.heartbeats.confirm(slim_lease(lease))

    def silent_nodes(self) -> set[str]:
        """Nodes whose Lease went silent: the scheduler still takes them for Ready."""
        return self.heartbeats.silent(None, STALE_HEARTBEAT_SECONDS)

    # writes: straight to the API server
    def patch_job_status(self, namespace: str, name: str, status: Manifest,
                         resource_version: str) -> str:
        return self.cluster.patch_job_status(namespace, name, status, resource_version)

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self.cluster.delete_job(namespace, name, uid)

    def get_pod(self, namespace: str, name: str) -> Manifest | None:
        return self.cluster.get_pod(namespace, name)

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        return self.cluster.get_service(namespace, name)

    def get_node(self, name: str) -> Manifest | None:
        return self.cluster.get_node(name)

    def pods_on_node(self, node: str) -> list[Manifest] | None:
        return self.cluster.pods_on_node(node)

    def create_pods(self, pods: Sequence[Manifest]) -> list[Created | Refused]:
        return self.cluster.create_pods(pods)

    def create_service(self, service: Manifest) -> Created:
        return self.cluster.create_service(service)

    def delete_pods(self, deletions: Sequence[PodDeletion]) -> None:
        self.cluster.delete_pods(deletions)

    def delete_generation(self, deletion: GenerationDeletion) -> None:
        self.cluster.delete_generation(deletion)

    def patch_pods(self, patches: Sequence[PodPatch]) -> list[bool]:
        return self.cluster.patch_pods(patches)

    def api_served(self, group_version: str, plural: str) -> bool:
        return self.cluster.api_served(group_version, plural)

    def create_object(self, path: str, manifest: Manifest) -> Created:
        return self.cluster.create_object(path, manifest)

    def get_object(self, path: str) -> Manifest | None:
        return self.cluster.get_object(path)

    def delete_object(self, path: str) -> None:
        self.cluster.delete_object(path)

    def replace_status(self, path: str, obj: Manifest, status: Manifest) -> Manifest:
        return self.cluster.replace_status(path, obj, status)

    def drop_finalizer(self, path: str, obj: Manifest, finalizer: str) -> None:
        self.cluster.drop_finalizer(path, obj, finalizer)

    def patch_object(self, path: str, patch: Manifest) -> None:
        self.cluster.patch_object(path, patch)

    def emit_event(self, job: Manifest, type_: str, reason: str, message: str,
                   now: datetime) -> None:
        self.cluster.emit_event(job, type_, reason, message, now)
