"""The controller: watch-fed caches → a work queue → reconcile passes, plus the progress
poller and leader election. The one place that decides *when* a job is looked at.

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
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from multiworker.api import names
from multiworker.api.conditions import Reason
from multiworker.api.status import TERMINAL_PHASES
from multiworker.clients import metrics
from multiworker.clients.agents import Agents
from multiworker.clients.heartbeats import NODE_LEASES_PATH, slim_lease
from multiworker.clients.informer import Informer, Key, Store
from multiworker.clients.kube import Cluster, PodPatch
from multiworker.clients.launchers import Launchers, LauncherTarget, launcher_targets
from multiworker.clients.leader import Elector
from multiworker.clients.poller import Poller
from multiworker.clients.relay import LoopRelay
from multiworker.clients.shapes import NODE, OBJECT, POD, Shape
from multiworker.clients.workqueue import WorkQueue, jittered
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS
from multiworker.decide.observe import Classified
from multiworker.decide.queueing import (
    FINALIZER,
    GROUP_VERSION,
    JOB_UID_LABEL,
    WORKLOADS,
    orphaned,
    workload_path,
)
from multiworker.logs import job_logger
from multiworker.reconcile.context import Options, Outcome
from multiworker.reconcile.events import event_type
from multiworker.reconcile.reconcile import reconcile
from multiworker.reconcile.view import View

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

RESYNC_SECONDS = 300.0  # a running job is looked at this often even without news
ERROR_BACKOFF_SECONDS = 1.0  # after a failed pass: 1, 2, 4, ... seconds
MAX_ERROR_BACKOFF_SECONDS = 60.0
EXPECT_SECONDS = 60.0  # a created pod the cache has not shown after this is missing after all
STUCK_PASS_SECONDS = 180.0  # a pass running longer than this means the operator is wedged
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


def _workload_job(workload: Manifest) -> Key | None:
    meta = workload.get("metadata", {})
    job = (meta.get("labels") or {}).get(names.LABEL_JOB_NAME)
    return (meta.get("namespace", ""), job) if job else None


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
    informers: list[Informer] = field(init=False, default_factory=list)
    _tasks: list[asyncio.Task[Any]] = field(init=False, default_factory=list)
    _relay: LoopRelay | None = field(init=False, default=None)  # informer threads → loop
    _failures: dict[Key, int] = field(init=False, default_factory=dict)
    _expected: dict[Key, dict[str, float]] = field(init=False, default_factory=dict)
    # When the pod watch last said anything of a (job, pod name): a pod created by a pass is
    # expected only if the watch has not spoken of it since that pass began (its ADDED, even
    # its DELETED, can arrive before the pass ends).
    _pod_seen: dict[Key, dict[str, float]] = field(init=False, default_factory=dict)
    _in_pass: dict[Key, float] = field(init=False, default_factory=dict)
    _jobs_per_namespace: dict[str, int] = field(init=False, default_factory=dict)
    _classified: dict[Key, Classified] = field(init=False, default_factory=dict)
    _written_at: dict[Key, datetime] = field(init=False, default_factory=dict)  # our last write
    # Nodes with workers whose Lease went silent, their jobs told once; told again on renewal.
    _silent_nodes: set[str] = field(init=False, default_factory=set)
    # Not waited for at start: without RBAC for kube-node-lease, the operator runs on and
    # finds lost nodes by their status alone.
    _lease_informer: Informer | None = field(init=False, default=None)
    _workload_informers: list[Informer] = field(init=False, default_factory=list)  # --kueue
    # Workloads held by our finalizer for jobs that are gone (decide/queueing.orphaned), by
    # (namespace, name): their namespaces are led even without jobs, so one is let go of.
    _orphans: set[Key] = field(init=False, default_factory=set)
    _synced: bool = field(init=False, default=False)  # the first lists are in the caches

    def __post_init__(self) -> None:
        self.view = View(self.cluster, Store(), Store(index_of=_pod_job), Store(),
                         workload_store=Store(index_of=_workload_job))
        self.queue = WorkQueue()
        metrics.WORKQUEUE_DEPTH.set_function(self.queue.waiting)
        self.poller = Poller(notify=self._notify_key, clock=self.clock,
                             status_seconds=self.progress_status_seconds)
        self._pods_by_node = Store(index_of=_node_of)  # the jobs a node event concerns
        self.launchers = Launchers(self._launcher_reported)
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
        self._synced = True
        log.info("caches synced: %d jobs, %d pods, %d nodes", len(self.view.job_store),
                 len(self.view.pod_store), len(self.view.node_store))
        self._tasks = [asyncio.create_task(self._work(), name=f"pass worker {i}")
                       for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self.poller.run(), name="progress poller"))
        self._tasks.append(asyncio.create_task(self._watch_heartbeats(), name="heartbeats"))
        self._release_orphans_in(None)  # where this instance leads: now; elsewhere, once it does
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
        now = time.monotonic()
        for key, started in self._in_pass.items():
            if now - started > STUCK_PASS_SECONDS:
                return f"the pass over {key[0]}/{key[1]} has run for {now - started:.0f}s"
        dead = [i.path for i in self._all_informers() if i.synced.is_set() and not i.alive]
        return f"informers stopped: {', '.join(dead)}" if dead else None

    def table_sizes(self) -> dict[str, int]:
        """Entries of every table the operator keeps per job, pod or node: each must follow
        what exists now, not every job ever seen (the soak benchmark churns thousands)."""
        return {
            "jobs": len(self.view.job_store), "pods": len(self.view.pod_store),
            "nodes": len(self.view.node_store), "workloads": len(self.view.workload_store),
            "pods by node": len(self._pods_by_node), "status writes": len(self.view.written),
            "polled jobs": len(self.poller.jobs), "queued": len(self.queue),
            "followed launchers": len(self.launchers), "failures": len(self._failures),
            "expected pods": len(self._expected), "pod sightings": len(self._pod_seen),
            "in pass": len(self._in_pass), "classified": len(self._classified),
            "written at": len(self._written_at), "namespaces": len(self._jobs_per_namespace),
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
            self._release_workloads_of(key, obj)
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
        name = obj["metadata"].get("name", "")
        self._expected.get(job, {}).pop(name, None)
        self._pod_seen.setdefault(job, {})[name] = time.monotonic()
        self.queue.add_after(job, _pod_batch_seconds(body))

    def _on_workload(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        obj = new or old
        assert obj is not None
        job = _workload_job(obj)
        if job is None:
            return
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if self._synced and new is not None and orphaned(new, self.view.job_store.get(job)):
            # Its job is gone: the garbage collector deletes it once nothing holds it.
            self._orphans.add(key)
            self._want()
            self._release_orphan(new)
            return
        if key in self._orphans:
            self._orphans.discard(key)
            self._want()
        if self.view.job_store.get(job) is not None:
            self.queue.add(job)

    def _release_workloads_of(self, key: Key, job: Manifest) -> None:
        """A deleted job's Workloads. The job and Workload watches are separate streams, and
        either may lead: a Workload's last event (the garbage collector deleting it) can come
        while the job is still listed, and then no later event finds it orphaned."""
        uid = job["metadata"].get("uid")
        for workload in self.view.workload_store.by_index(key):
            if (workload["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == uid:
                self._release_orphan(workload)

    def _release_orphans_in(self, namespace: str | None) -> None:
        """Sweep the cache for Workloads whose job went while no instance of ours led its
        namespace (the operator down, a leader change): their last event came before this
        instance led, and no later one would come."""
        known = len(self._orphans)
        for key in self.view.workload_store:
            workload = self.view.workload_store.get(key)
            job = _workload_job(workload) if workload is not None else None
            if workload is None or job is None or namespace not in (None, key[0]):
                continue
            if orphaned(workload, self.view.job_store.get(job)):
                self._orphans.add(key)
                self._release_orphan(workload)
        if len(self._orphans) != known:
            self._want()

    def _release_orphan(self, workload: Manifest) -> None:
        """Only the namespace's leader, with its caches synced: a Workload seen before its
        job (two watches) is no orphan, and the leader made it from a cache that has the job."""
        meta = workload["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []) or not self._synced or \
                not self.leads(meta.get("namespace", "")):
            return
        path = workload_path(meta.get("namespace", ""), meta["name"])
        def drop() -> None:
            try:
                self.view.cluster.drop_finalizer(path, workload, FINALIZER)
            except Exception as e:  # a conflict or an error: its next event retries
                log.info("releasing Workload %s of a deleted job: %s", path, e)

        asyncio.get_running_loop().run_in_executor(None, drop)

    def _on_node(self, kind: str, old: Manifest | None, new: Manifest | None) -> None:
        if old is not None and new is not None and _node_health(old) == _node_health(new):
            return  # a heartbeat or label change: nothing a pass looks at
        self._wake_jobs_on((new or old or {}).get("metadata", {}).get("name", ""))

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
            self.elector.want(set(self._jobs_per_namespace) | {ns for ns, _ in self._orphans})

    def _leadership_changed(self, namespace: str, leading: bool) -> None:
        for key in self.view.job_store:
            if key[0] == namespace:
                if leading:
                    self.queue.add(key)
                else:
                    self.poller.pause(key)  # the next pass resumes it, or drops it
                    self.launchers.forget(key)
        if leading:
            self._release_orphans_in(namespace)
        else:
            metrics.forget_jobs_in(namespace)  # the new leader exports them

    def leads(self, namespace: str) -> bool:
        return self.elector is None or self.elector.leads(namespace)

    # --- passes ---

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)

    async def _process(self, key: Key) -> None:
        if not self.leads(key[0]):
            self.poller.pause(key)
            return
        now = self.clock()
        expected = self._still_expected(key)
        began = self._in_pass[key] = time.monotonic()
        started = time.perf_counter()
        try:
            outcome = await asyncio.to_thread(reconcile, self.view, key[0], key[1], now,
                                              self.poller.health(key), expected,
                                              self.options,
                                              self._classified.setdefault(key, Classified()),
                                              self._written_at.get(key))
        except Exception as e:  # every error: log, report once per streak, retry with backoff
            await self._failed(key, e)
            return
        finally:
            self._in_pass.pop(key, None)
            metrics.PASS_SECONDS.observe(time.perf_counter() - started)
        self._failures.pop(key, None)
        self._after(key, outcome, now, began)

    def _after(self, key: Key, outcome: Outcome, now: datetime, began: float) -> None:
        if outcome.gone:
            self.poller.forget(key)
            self.launchers.forget(key)
            self.queue.forget(key)
            self.view.forget(key)
            self._expected.pop(key, None)
            self._pod_seen.pop(key, None)
            self._classified.pop(key, None)
            self._written_at.pop(key, None)
            metrics.set_job_phase(key[0], key[1], None)
            metrics.set_job_status(key[0], key[1], None)
            return
        if outcome.written is not None:
            self.view.remember_write(key, *outcome.written)
            self._written_at[key] = now
        if outcome.created:
            deadline = time.monotonic() + EXPECT_SECONDS
            seen = self._pod_seen.get(key, {})
            unseen = [n for n in outcome.created if seen.get(n, 0.0) < began]
            self._expected.setdefault(key, {}).update(dict.fromkeys(unseen, deadline))
        self.poller.after_pass(key, outcome.targets, now)
        self.agents.tell(outcome.agent_notes)
        self.launchers.follow(key, launcher_targets(self.view.cached_pods(*key)))
        requeue = outcome.requeue
        job = self.view.cached_job(*key)
        status = (job or {}).get("status") or {}
        metrics.set_job_status(key[0], key[1], status if job is not None else None)
        phase = status.get("phase")
        active = phase not in TERMINAL_PHASES and phase != "Suspended"
        if requeue is None and active:
            requeue = jittered(self.resync_seconds)
        if requeue is not None:
            self.queue.add_after(key, requeue)

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

    def _still_expected(self, key: Key) -> frozenset[str]:
        pending = self._expected.get(key)
        if not pending:
            return frozenset()
        now = time.monotonic()
        for name in [n for n, deadline in pending.items() if deadline < now]:
            del pending[name]
        return frozenset(pending)

    async def _failed(self, key: Key, error: Exception) -> None:
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(MAX_ERROR_BACKOFF_SECONDS,
                    self.error_backoff_seconds * 2 ** min(failures - 1, 16))
        metrics.RECONCILE_ERRORS.inc()
        job_logger(*key).error("reconcile failed (%d in a row), retrying in %gs: %s",
                               failures, delay, error, exc_info=error)
        self.queue.add_after(key, delay)
        if failures != 1:
            return  # one Event per streak of errors, not one per retry
        body = self.view.cached_job(*key)
        if body is not None:
            message = f"the operator could not reconcile this job and will retry: {error}"
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.cluster.emit_event, body, event_type(Reason.RECONCILE_ERROR),
                    Reason.RECONCILE_ERROR, message, self.clock())


def _node_health(node: Manifest) -> tuple[Any, ...]:
    """What lost-node detection reads of a node: Ready, taints, existence."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next(((c.get("status"), c.get("lastTransitionTime")) for c in conditions
                  if c.get("type") == "Ready"), None)
    taints = tuple(sorted((t.get("key", ""), t.get("effect", ""))
                          for t in (node.get("spec") or {}).get("taints") or []))
    return ready, taints
