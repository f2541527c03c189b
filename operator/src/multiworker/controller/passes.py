"""The pass runner: takes jobs off the work queue, runs one reconcile pass over each in a
thread (the kubernetes client is synchronous; never two passes over one job at once:
workqueue.py), and acts on what the pass returns — when to look again, whom to poll, the
agents' notes, the launchers to follow, the pods it created that the cache must show before
they count as missing — with a backoff and one Event per streak of failed passes.

It keeps what a pass needs of the ones before it (its pods as classified, when this operator
last wrote the status) and forgets a job once a pass finds it gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from multiworker.api.conditions import Reason
from multiworker.api.status import TERMINAL_PHASES
from multiworker.clients import metrics
from multiworker.clients.agents import Agents
from multiworker.clients.informer import Key
from multiworker.clients.launchers import Launchers, launcher_targets
from multiworker.clients.poller import Poller
from multiworker.clients.workqueue import WorkQueue, jittered
from multiworker.decide.observe import Classified
from multiworker.logs import job_logger
from multiworker.reconcile.context import Options, Outcome
from multiworker.reconcile.events import event_type
from multiworker.reconcile.reconcile import reconcile
from multiworker.reconcile.view import View

MAX_ERROR_BACKOFF_SECONDS = 60.0
EXPECT_SECONDS = 60.0  # a created pod the cache has not shown after this is missing after all
STUCK_PASS_SECONDS = 180.0  # a pass running longer than this means the operator is wedged


@dataclass
class PassRunner:
    view: View
    queue: WorkQueue[Key]
    poller: Poller
    agents: Agents
    launchers: Launchers
    leads: Callable[[str], bool]  # whether this instance acts in a namespace now
    options: Options
    clock: Callable[[], datetime]
    resync_seconds: float
    error_backoff_seconds: float
    _failures: dict[Key, int] = field(default_factory=dict)
    _expected: dict[Key, dict[str, float]] = field(default_factory=dict)
    # When the pod watch last said anything of a (job, pod name): a pod created by a pass is
    # expected only if the watch has not spoken of it since that pass began (its ADDED, even
    # its DELETED, can arrive before the pass ends).
    _pod_seen: dict[Key, dict[str, float]] = field(default_factory=dict)
    _in_pass: dict[Key, float] = field(default_factory=dict)
    _classified: dict[Key, Classified] = field(default_factory=dict)
    _written_at: dict[Key, datetime] = field(default_factory=dict)  # our last write

    async def work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.process(key)
            finally:
                self.queue.done(key)

    def pod_seen(self, job: Key, name: str) -> None:
        """The pod watch spoke of pod `name` of `job`: no longer expected."""
        self._expected.get(job, {}).pop(name, None)
        self._pod_seen.setdefault(job, {})[name] = time.monotonic()

    def stuck(self) -> str | None:
        """A pass that has run too long (for the liveness probe), or None."""
        now = time.monotonic()
        for key, started in self._in_pass.items():
            if now - started > STUCK_PASS_SECONDS:
                return f"the pass over {key[0]}/{key[1]} has run for {now - started:.0f}s"
        return None

    def table_sizes(self) -> dict[str, int]:
        return {"failures": len(self._failures), "expected pods": len(self._expected),
                "pod sightings": len(self._pod_seen), "in pass": len(self._in_pass),
                "classified": len(self._classified), "written at": len(self._written_at)}

    async def process(self, key: Key) -> None:
        if not self.leads(key[0]):
            self.poller.pause(key)
            return
        now = self.clock()
        expected = self.still_expected(key)
        began = self._in_pass[key] = time.monotonic()
        started = time.perf_counter()
        try:
            outcome = await asyncio.to_thread(reconcile, self.view, key[0], key[1], now,
                                              self.poller.health(key), expected,
                                              self.options,
                                              self._classified.setdefault(key, Classified()),
                                              self._written_at.get(key))
        except Exception as e:  # every error: log, report once per streak, retry with backoff
            await self.failed(key, e)
            return
        finally:
            self._in_pass.pop(key, None)
            metrics.PASS_SECONDS.observe(time.perf_counter() - started)
        self._failures.pop(key, None)
        self.after(key, outcome, now, began)

    def after(self, key: Key, outcome: Outcome, now: datetime, began: float) -> None:
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

    def still_expected(self, key: Key) -> frozenset[str]:
        pending = self._expected.get(key)
        if not pending:
            return frozenset()
        now = time.monotonic()
        for name in [n for n, deadline in pending.items() if deadline < now]:
            del pending[name]
        return frozenset(pending)

    async def failed(self, key: Key, error: Exception) -> None:
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
                    self.view.cluster.emit_event, body, event_type(Reason.RECONCILE_ERROR),
                    Reason.RECONCILE_ERROR, message, self.clock())
