"""Thin kopf wiring: one reconcile loop per job, woken by watch events on the job and its pods.

Why not `@kopf.daemon`: kopf puts a finalizer on every object that has a daemon and does not
remove it when the operator stops, so deleting a job — or its namespace — hangs whenever the
operator is down. A job needs no cleanup beyond owner-reference garbage collection, so its loop
is a plain asyncio task: started by the job's watch events (kopf replays every existing job at
start-up) and cancelled by its DELETED event. No finalizer, no kopf annotations on the job.

With kopf peering (HA replicas), kopf pauses only its own watch streams: a paused replica's
loops keep resyncing. That is safe, not just tolerated: every pass writes its status only if
the job is unchanged since it read it, and never deletes pods of a newer generation (see
reconcile.py), so two replicas cannot fight over a job.
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
from multiworker.k8s import ClusterIO
from multiworker.logs import job_logger
from multiworker.reconcile import reconcile
from multiworker.transitions import Outcome

Key = tuple[str, str]  # (namespace, name)

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
    """The per-job reconcile loops and their wake-up events."""

    cluster: ClusterIO
    clock: Callable[[], datetime] = utc_now
    resync_seconds: float = RESYNC_SECONDS
    error_backoff_seconds: float = ERROR_BACKOFF_SECONDS
    tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    wakeups: dict[Key, asyncio.Event] = field(default_factory=dict)

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
        namespace, name = key
        wake = self.wakeups[key]
        failures = 0
        while True:
            wake.clear()
            try:
                outcome = await asyncio.to_thread(
                    reconcile, self.cluster, namespace, name, self.clock()
                )
                failures = 0
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)
        if self.tasks.get(key) is asyncio.current_task():
            self.tasks.pop(key, None)
            self.wakeups.pop(key, None)

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


@kopf.on.cleanup(registry=registry)
async def stop_loops(memo: Any, **_: Any) -> None:
    loops: JobLoops = memo.loops
    await loops.stop_all()
