"""Thin kopf wiring: one reconcile loop per job, woken by watch events on the job and its pods.

Why not `@kopf.daemon`: kopf puts a finalizer on every object that has a daemon and does not
remove it when the operator stops, so deleting a job — or its namespace — hangs whenever the
operator is down. A job needs no cleanup beyond owner-reference garbage collection, so its loop
is a plain asyncio task: started by the job's watch events (kopf replays every existing job at
start-up) and cancelled by its DELETED event. No finalizer, no kopf annotations on the job.

With kopf peering (HA replicas), kopf pauses only its own watch streams, so the loops follow
the peering object themselves (peering.py) and idle while another replica leads. The few
seconds until they notice are safe: every pass writes its status only if the job is unchanged
since it read it, and never deletes pods of a newer generation (see reconcile.py), so two
replicas cannot fight over a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from multiworker import metrics, names
from multiworker.k8s import Cluster, ClusterIO
from multiworker.logs import job_logger
from multiworker.peering import Peering, must_pause
from multiworker.reconcile import reconcile
from multiworker.transitions import Outcome
from multiworker.watch import ProgressWatch

Key = tuple[str, str]  # (namespace, name)

PEERING_POLL_SECONDS = 2.0  # how soon loops idle when another replica takes the lead
RESYNC_SECONDS = 10.0  # look again at least this often, even without events
ERROR_BACKOFF_SECONDS = 1.0  # after a failed pass: 1, 2, 4, ... seconds
MAX_ERROR_BACKOFF_SECONDS = 60.0

registry = kopf.OperatorRegistry()
log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


def operator_settings() -> kopf.OperatorSettings:
    """kopf's bookkeeping under our own prefix; our own Events instead of kopf's."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False
    # Restart watches now and then: a silently dead connection must not blind the operator.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    return settings


@dataclass
class JobLoops:
    """The per-job reconcile loops, their wake-up events and progress watches.

    Between passes a loop polls its workers' progress (watch.py) and runs the next pass early
    when the watch has news. While `paused` (another operator replica has the lead), loops
    neither reconcile nor poll.
    """

    cluster: ClusterIO
    clock: Callable[[], datetime] = utc_now
    resync_seconds: float = RESYNC_SECONDS
    error_backoff_seconds: float = ERROR_BACKOFF_SECONDS
    new_watch: Callable[[], ProgressWatch] = ProgressWatch
    tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    wakeups: dict[Key, asyncio.Event] = field(default_factory=dict)
    active: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.active.set()

    @property
    def paused(self) -> bool:
        return not self.active.is_set()

    def pause(self, paused: bool) -> None:
        """Idle every loop (another replica leads) or let them run again."""
        if paused:
            self.active.clear()
        else:
            self.active.set()

    def ensure(self, key: Key) -> None:
        """Start the job's loop if it is not running, and wake it."""
        task = self.tasks.get(key)
        if task is None or task.done():
            self.wakeups[key] = asyncio.Event()
            self.tasks[key] = asyncio.create_task(self._loop(key), name=f"mwj/{key[0]}/{key[1]}")
        self.wake(key)

    def wake(self, key: Key) -> None:
        event = self.wakeups.get(key)
        if event is not None:
            event.set()

    async def stop(self, key: Key) -> None:
        task = self.tasks.pop(key, None)
        self.wakeups.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        metrics.set_job_phase(key[0], key[1], None)

    async def stop_all(self) -> None:
        for key in list(self.tasks):
            await self.stop(key)

    async def _loop(self, key: Key) -> None:
        wake, watch = self.wakeups[key], self.new_watch()
        failures = 0
        while True:
            await self.active.wait()
            wake.clear()
            try:
                outcome = await asyncio.to_thread(
                    reconcile, self.cluster, key[0], key[1], self.clock(), watch.health
                )
                failures = 0
                watch.after_pass(outcome.targets, self.clock())
            except Exception as e:  # every error: log, report, retry with backoff
                failures += 1
                delay = min(MAX_ERROR_BACKOFF_SECONDS,
                            self.error_backoff_seconds * 2 ** min(failures - 1, 16))
                await asyncio.to_thread(self._report_error, key, e, failures, delay)
                outcome = Outcome(requeue=delay)
            if outcome.gone:
                break
            timeout = self.resync_seconds
            if outcome.requeue is not None:
                timeout = outcome.requeue if failures else min(outcome.requeue, timeout)
            await self._between_passes(wake, watch, timeout)
        if self.tasks.get(key) is asyncio.current_task():
            self.tasks.pop(key, None)
            self.wakeups.pop(key, None)

    async def _between_passes(
        self, wake: asyncio.Event, watch: ProgressWatch, timeout: float
    ) -> None:
        """Until woken or `timeout`: poll the workers' progress, and end early on news."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (left := deadline - loop.time()) > 0:
            polling = watch.targets is not None and not self.paused
            if await _woken(wake, min(left, watch.poll_seconds) if polling else left):
                return
            if polling and loop.time() < deadline and await watch.poll(self.clock):
                return

    def _report_error(self, key: Key, error: Exception, failures: int, delay: float) -> None:
        metrics.RECONCILE_ERRORS.inc()
        job_logger(*key).error(
            "reconcile failed (%d in a row), retrying in %gs: %s", failures, delay, error,
            exc_info=error,
        )
        if failures != 1:
            return  # one Event per streak of errors, not one per retry
        with contextlib.suppress(Exception):
            body = self.cluster.get_job(*key)
            if body is not None:
                self.cluster.emit_event(
                    body, "Warning", "ReconcileError",
                    f"the operator could not reconcile this job and will retry: {error}",
                    self.clock(),
                )


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """$KUBECONFIG (or ~/.kube/config), else the in-cluster service account."""
    return kopf.login_via_client(**kwargs)


async def _woken(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` up to `timeout` seconds; whether it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
    return event.is_set()


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry)
async def job_event(
    type: str, name: str, namespace: str | None, memo: Any, **_: Any
) -> None:
    loops: JobLoops = memo.loops
    key = (namespace or "", name)
    if type == "DELETED":
        await loops.stop(key)
    else:
        loops.ensure(key)


@kopf.on.event("", "v1", "pods", labels={names.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry)
async def pod_event(
    labels: Mapping[str, str], namespace: str | None, memo: Any, **_: Any
) -> None:
    loops: JobLoops = memo.loops
    loops.wake((namespace or "", labels[names.LABEL_JOB_NAME]))


@kopf.on.startup(registry=registry)
async def follow_peering(memo: Any, **_: Any) -> None:
    """With peering, decide once before any job event arrives, then keep following."""
    if getattr(memo, "peering", None) is None:
        return
    follower = PeeringFollower(memo.cluster, memo.peering, memo.loops)
    await follower.look()
    memo.peering_task = asyncio.create_task(follower.run(), name="mwj/peering")


@kopf.on.cleanup(registry=registry)
async def stop_loops(memo: Any, **_: Any) -> None:
    task: asyncio.Task[None] | None = getattr(memo, "peering_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    loops: JobLoops = memo.loops
    await loops.stop_all()


@dataclass
class PeeringFollower:
    """Pauses the loops while kopf, by its own rule, has paused this replica."""

    cluster: Cluster
    peering: Peering
    loops: JobLoops
    clock: Callable[[], datetime] = utc_now
    interval: float = PEERING_POLL_SECONDS

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.look()

    async def look(self) -> None:
        peering = self.peering
        try:
            found = await asyncio.to_thread(
                lambda: [self.cluster.get_peering(ns, peering.name) for ns in peering.locations])
        except Exception as e:  # keep the last verdict; kopf keeps its own
            log.warning("could not read peering %s: %s", peering.name, e)
            return
        now_paused = must_pause(found, peering.identity, peering.priority, self.clock())
        if now_paused != self.loops.paused:
            log.info("%s job loops: %s", "pausing" if now_paused else "resuming",
                     "another replica has the lead" if now_paused else "this replica leads")
        self.loops.pause(now_paused)
