"""The controller's wiring: the informers that feed the caches, their events waking jobs on
the work queue, the pass workers (passes.py), the progress poller, and the namespaces this
instance leads. The one place that decides *when* a job is looked at.

A job is reconciled when something about it changes — its spec or status (not the echo of
our own status write), one of its pods, the node of one of its pods — when a pass asked to
look again at a given time (backoff, deadlines), when the poller has news, and on a slow
jittered resync while it runs. Finished and suspended jobs cost nothing until they change.
Passes run in threads (the kubernetes client is synchronous), a bounded number at once,
never two for the same job (workqueue.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from multiworker.api import names
from multiworker.clients import metrics
from multiworker.clients.agents import Agents
from multiworker.clients.heartbeats import NODE_LEASES_PATH, slim_lease
from multiworker.clients.informer import Informer, Key, Store
from multiworker.clients.kube import Cluster
from multiworker.clients.launchers import Launchers, LauncherTarget
from multiworker.clients.leader import Elector
from multiworker.clients.poller import Poller
from multiworker.clients.relay import LoopRelay
from multiworker.clients.shapes import NODE, OBJECT, POD, Shape
from multiworker.clients.workqueue import WorkQueue
from multiworker.clients.writes import PodPatch
from multiworker.controller.passes import PassRunner
from multiworker.controller.workloads import GoneJobsWorkloads, workload_job
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS
from multiworker.decide.queueing import (
    GROUP_VERSION,
    WORKLOADS,
    workload_path,
)
from multiworker.reconcile.context import Options
from multiworker.reconcile.view import View

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

RESYNC_SECONDS = 300.0  # a running job is looked at this often even without news
ERROR_BACKOFF_SECONDS = 1.0  # after a failed pass: 1, 2, 4, ... seconds
# A pod event wakes its job after this much per worker (between POD_BATCH_MIN_SECONDS and
# POD_BATCH_MAX_SECONDS), so one pass covers the events that arrive meanwhile: a pass reads the
# whole group, and a group of 1,024 starting sends ~5,000 pod events. Up to 50 workers wait
# 25 ms (a group of 8 ran ~26 passes for one start and restart at 4 ms), 1,024 wait 0.5 s —
# what this adds to noticing a failure, against restarts that take seconds at that size.
POD_BATCH_SECONDS_PER_WORKER = 0.0005
POD_BATCH_MIN_SECONDS = 0.025
POD_BATCH_MAX_SECONDS = 0.5
# How often the nodes that run workers are checked for a Lease gone silent: no event says so.
HEARTBEAT_CHECK_SECONDS = 1.0


def utc_now() -> datetime:
    return datetime.now(UTC)


def _pod_job(pod: Manifest) -> Key | None:
    meta = pod.get("metadata", {})
    job = (meta.get("labels") or {}).get(names.LABEL_JOB_NAME)
    return (meta.get("namespace", ""), job) if job else None


def _pod_batch_seconds(job: Manifest) -> float:
    workers = (job.get("spec") or {}).get("workers")
    if not isinstance(workers, int):
        return 0.0
    return min(POD_BATCH_MAX_SECONDS,
               max(POD_BATCH_MIN_SECONDS, workers * POD_BATCH_SECONDS_PER_WORKER))


def _node_of(pod: Manifest) -> Key | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return ("", node) if node else None


@dataclass
class Controller:
    """Runs everything: informers (threads), pass workers, the poller and the elector."""

    cluster: Cluster
    namespaces: Collection[str] | None  # None: every namespace
    identity: str | None  # None: --standalone, no leader election
    workers: int = 8  # passes at once
    resync_seconds: float = RESYNC_SECONDS
    error_backoff_seconds: float = ERROR_BACKOFF_SECONDS
    progress_status_seconds: float = 10.0
    options: Options = field(default_factory=Options)  # what passes need of the command line
    clock: Callable[[], datetime] = utc_now
    view: View = field(init=False)
    queue: WorkQueue[Key] = field(init=False)
    poller: Poller = field(init=False)
    agents: Agents = field(init=False, default_factory=Agents)
    launchers: Launchers = field(init=False)
    elector: Elector | None = field(init=False, default=None)
    passes: PassRunner = field(init=False)
    workloads: GoneJobsWorkloads = field(init=False)  # --kueue: of jobs that are gone
    informers: list[Informer] = field(init=False, default_factory=list)
    _tasks: list[asyncio.Task[Any]] = field(init=False, default_factory=list)
    _relay: LoopRelay | None = field(init=False, default=None)  # informer threads → loop
    _jobs_per_namespace: dict[str, int] = field(init=False, default_factory=dict)
    # Nodes with workers whose Lease went silent, their jobs told once; told again on renewal.
    _silent_nodes: set[str] = field(init=False, default_factory=set)
    # Until then a node's ADDED is the initial list, and start() queues every job once synced.
    _caches_synced: bool = field(init=False, default=False)
    # Not waited for at start: without RBAC for kube-node-lease, the operator runs on and
    # finds lost nodes by their status alone.
    _lease_informer: Informer | None = field(init=False, default=None)
    _workload_informers: list[Informer] = field(init=False, default_factory=list)  # --kueue
    def __post_init__(self) -> None:
        self.view = View(self.cluster, Store(), Store(index_of=_pod_job), Store(),
                         workload_store=Store(index_of=workload_job))
        self.queue = WorkQueue()
        metrics.WORKQUEUE_DEPTH.set_function(self.queue.waiting)
        self.poller = Poller(notify=self._notify_key, clock=self.clock,
                             status_seconds=self.progress_status_seconds)
        self._pods_by_node = Store(index_of=_node_of)  # the jobs a node event concerns
        self.launchers = Launchers(self._launcher_reported)
        self.passes = PassRunner(self.view, self.queue, self.poller, self.agents,
                                 self.launchers, self.leads, self.options, self.clock,
                                 self.resync_seconds, self.error_backoff_seconds)
        self.workloads = GoneJobsWorkloads(self.view, self.leads, self._want)
        metrics.track_tables(self.table_sizes)

    # --- lifecycle ---

    async def start(self) -> None:
        self._relay = LoopRelay(asyncio.get_running_loop())
        if self.identity is not None:
            self.elector = Elector(self.cluster, self.identity, self._leadership_changed)
        scopes: list[str | None] = list(self.namespaces) if self.namespaces is not None \
            else [None]
        for ns in scopes:
            self.informers.append(self._informer(
                names.job_path(ns) if ns else f"/apis/{names.GROUP}/{names.VERSION}/"
                f"{names.PLURAL}", self.view.job_store, self._on_job, ns, None, OBJECT))
            self.informers.append(self._informer(
                f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods",
                self.view.pod_store, self._on_pod, ns, names.POD_WATCH_SELECTOR, POD))
        self.informers.append(self._informer("/api/v1/nodes", self.view.node_store,
                                             self._on_node, None, None, NODE))
        for informer in self.informers:
            informer.start()
        # Not waited for: without Kueue installed, a queued job says so (queueing.py).
        self._workload_informers = [self._informer(
            workload_path(ns) if ns else f"/apis/{GROUP_VERSION}/{WORKLOADS}",
            self.view.workload_store, self._on_workload, ns, names.LABEL_JOB_NAME, OBJECT)
            for ns in scopes] if self.options.kueue else []
        self.view.workloads_synced = [i.synced for i in self._workload_informers]
        for informer in self._workload_informers:
            informer.start()
        self._lease_informer = self._informer(NODE_LEASES_PATH, Store(), self._on_lease,
                                              None, None, Shape.of(slim_lease))
        self._lease_informer.on_state = self.view.heartbeats.watch_state
        self._lease_informer.start()
        await asyncio.to_thread(self._wait_synced)
        self.workloads.synced = self._caches_synced = True
        log.info("caches synced: %d jobs, %d pods, %d nodes", len(self.view.job_store),
                 len(self.view.pod_store), len(self.view.node_store))
        self._tasks = [asyncio.create_task(self.passes.work(), name=f"pass worker {i}")
                       for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self.poller.run(), name="progress poller"))
        self._tasks.append(asyncio.create_task(self._watch_heartbeats(), name="heartbeats"))
        self.workloads.sweep(None)  # where this instance leads: now; elsewhere, once it does
        if self.elector is not None:
            self._want()
            self._tasks.append(asyncio.create_task(self.elector.run(), name="leader election"))
        for key in self.view.job_store:
            self.queue.add(key)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.agents.close()
        await self.launchers.close()
        for informer in self._all_informers():
            informer.stop()
        if self.elector is not None:
            await self.elector.release_all()

    def stuck(self) -> str | None:
        """Why the operator is wedged (for the liveness probe), or None."""
        dead = [i.path for i in self._all_informers() if i.synced.is_set() and not i.alive]
        return self.passes.stuck() or (f"informers stopped: {', '.join(dead)}" if dead else None)

    def table_sizes(self) -> dict[str, int]:
        """Entries of every table the operator keeps per job, pod or node: each must follow
        what exists now, not every job ever seen (the soak benchmark churns thousands)."""
        return {
            "jobs": len(self.view.job_store), "pods": len(self.view.pod_store),
            "nodes": len(self.view.node_store), "workloads": len(self.view.workload_store),
            "pods by node": len(self._pods_by_node), "status writes": len(self.view.written),
            "polled jobs": len(self.poller.jobs), "queued": len(self.queue),
            "followed launchers": len(self.launchers), **self.passes.table_sizes(),
            "namespaces": len(self._jobs_per_namespace),
            "gone jobs' workloads": len(self.workloads),
            "job series": metrics.tracked_series(),
        }

    def _all_informers(self) -> list[Informer]:
        return [*self.informers, *([self._lease_informer] if self._lease_informer else []),
                *self._workload_informers]

    def _informer(self, path: str, store: Store, listener: Callable[..., None],
                  namespace: str | None, selector: str | None,
                  shape: Shape) -> Informer:
        assert self._relay is not None
        return Informer(self.cluster, path, store, self._relay.to(listener), namespace,
                        selector, shape)

    def _wait_synced(self) -> None:
        for informer in self.informers:
            while not informer.synced.wait(5):
                log.info("waiting for the first list of %s", informer.path)

    # --- events (on the event loop) ---

    def _on_job(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        obj = new or old
        assert obj is not None
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if (old is None) != (new is None):
            self._count_namespace(key[0], +1 if new is not None else -1)
        if new is None:
            self.poller.forget(key)  # also where no pass of this instance will see it gone
            self.workloads.of_deleted_job(key, obj)
        if new is not None and self._own_echo(key, new):
            return
        self.queue.add(key)

    def _own_echo(self, key: Key, new: Manifest) -> bool:
        """The event of one of our own status writes (the latest, or one it replaced): nothing
        new to look at."""
        ours = self.view.written.get(key)
        version = new["metadata"].get("resourceVersion")
        return ours is not None and \
            (ours[1]["metadata"]["resourceVersion"] == version or version in ours[0])

    def _on_pod(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        obj = new or old
        assert obj is not None
        job = _pod_job(obj)
        if job is None:
            return
        self._pods_by_node_update(old, new)
        body = self.view.job_store.get(job)
        if body is None:
            # Its job is gone (the garbage collector deletes the pods) or not listed yet (its
            # ADDED brings a pass): nothing for a pass to do. A group of 8 deleted woke ~10.
            return
        self.passes.pod_seen(job, obj["metadata"].get("name", ""))
        self.queue.add_after(job, _pod_batch_seconds(body))

    def _on_workload(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        obj = new or old
        assert obj is not None
        job = workload_job(obj)
        if job is None:
            return
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if self.workloads.on_event(new, key, job):
            return
        if self.view.job_store.get(job) is not None:
            self.queue.add(job)

    def _on_node(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        if new is not None and (old is None or _node_room(old) != _node_room(new)):
            self._wake_held_back_jobs()
        if old is not None and new is not None and _node_health(old) == _node_health(new):
            return  # a heartbeat or label change: nothing lost-node detection looks at
        self._wake_jobs_on((new or old or {}).get("metadata", {}).get("name", ""))

    def _wake_held_back_jobs(self) -> None:
        """A node added, or one whose labels, taints or resources changed, may be the room a
        job held back waits for (no GPU product holds it, creation._hold_back): its pass looks
        now rather than at its next retry, up to 30 s later. Rare events, so a scan (not
        during the initial list: nodes × jobs)."""
        if not self._caches_synced:
            return
        for key in self.view.job_store:
            body = self.view.cached_job(*key)
            if body is not None and (body.get("status") or {}).get("blockedSince"):
                self.queue.add(key)

    def _on_lease(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        node = self.view.heartbeats.on_lease(kind, old, new)
        if node is not None and node in self._silent_nodes:
            self._silent_nodes.discard(node)  # renewed again: its jobs look once more
            self._wake_jobs_on(node)

    async def _watch_heartbeats(self) -> None:
        """Wakes the jobs on a node whose Lease went silent (no event says so), once; their
        passes then look again when it would count as lost (lost_nodes.lost_node_deadline)."""
        while True:
            await asyncio.sleep(HEARTBEAT_CHECK_SECONDS)
            nodes = {node for _, node in self._pods_by_node.indexes()}
            for node in self.view.heartbeats.silent(nodes, STALE_HEARTBEAT_SECONDS) \
                    - self._silent_nodes:
                log.warning("node %s: no Lease renewal seen for %.0fs", node,
                            self.view.heartbeats.silence(node) or 0)
                self._silent_nodes.add(node)
                self._wake_jobs_on(node)
            self._silent_nodes &= nodes

    def _wake_jobs_on(self, node: str) -> None:
        for pod in self._pods_by_node.by_index(("", node)):
            job = _pod_job(pod)
            if job is not None:
                self.queue.add(job)

    def _pods_by_node_update(self, old: Manifest | None, new: Manifest | None) -> None:
        """Index a pod by its node; most pod events keep the node (and the job) as it was."""
        if old is not None and new is not None and _node_of(old) == _node_of(new):
            return
        if new is None:
            if old is not None:
                self._pods_by_node.remove((old["metadata"].get("namespace", ""),
                                           old["metadata"]["name"]))
        else:
            self._pods_by_node.put(new)

    def _notify_key(self, key: Any) -> None:
        self.queue.add(key)

    def _count_namespace(self, namespace: str, delta: int) -> None:
        count = self._jobs_per_namespace.get(namespace, 0) + delta
        if count > 0:
            self._jobs_per_namespace[namespace] = count
        else:
            self._jobs_per_namespace.pop(namespace, None)
        self._want()

    def _want(self) -> None:
        """Lead the namespaces with jobs, and those with a Workload to let go of."""
        if self.elector is not None:
            self.elector.want(set(self._jobs_per_namespace) | self.workloads.namespaces())

    def _leadership_changed(self, namespace: str, leading: bool) -> None:
        for key in self.view.job_store:
            if key[0] == namespace:
                if leading:
                    self.queue.add(key)
                else:
                    self.poller.pause(key)  # the next pass resumes it, or drops it
                    self.launchers.forget(key)
        if leading:
            self.workloads.sweep(namespace)
        else:
            metrics.forget_jobs_in(namespace)  # the new leader exports them

    def leads(self, namespace: str) -> bool:
        return self.elector is None or self.elector.leads(namespace)

    # --- passes ---

    async def _launcher_reported(self, target: LauncherTarget, report: str) -> None:
        """Copy a warm launcher's news onto its pod (launchers.py): the pod's event then
        wakes the job's pass, which reads it there."""
        if not self.leads(target.namespace):
            return
        pod = self.view.pod_store.get((target.namespace, target.pod))
        meta = (pod or {}).get("metadata") or {}
        if meta.get("uid") != target.uid or \
                (meta.get("annotations") or {}).get(names.ANNOTATION_LAUNCHER) == report:
            return
        await asyncio.to_thread(self.cluster.patch_pods, [PodPatch(
            target.namespace, target.pod, target.uid,
            annotations={names.ANNOTATION_LAUNCHER: report})])


def _node_room(node: Manifest) -> tuple[Any, ...]:
    """What GPU placement reads of a node (creation.usable_nodes): labels, taints, whether it
    is cordoned, allocatable resources."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, \
        node.get("status") or {}
    return (sorted((meta.get("labels") or {}).items()),
            sorted((t.get("key", ""), t.get("value", ""), t.get("effect", ""))
                   for t in spec.get("taints") or []),
            bool(spec.get("unschedulable")), sorted((status.get("allocatable") or {}).items()))


def _node_health(node: Manifest) -> tuple[Any, ...]:
    """What lost-node detection reads of a node: Ready, taints, existence."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next(((c.get("status"), c.get("lastTransitionTime")) for c in conditions
                  if c.get("type") == "Ready"), None)
    taints = tuple(sorted((t.get("key", ""), t.get("effect", ""))
                          for t in (node.get("spec") or {}).get("taints") or []))
    return ready, taints
