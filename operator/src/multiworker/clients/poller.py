"""Polls GET /progress of the running workers of every job this instance handles, keeps their
tracks in memory (progress.py) and wakes a job's reconcile pass only on news: a hang, a change
of stragglers or of detection state, or progress worth writing.

One pooled HTTP session with keep-alive for all jobs, bounded concurrency, jittered per-job
schedules. The rate follows spec.health.progressTimeoutSeconds (a hang verdict is late by at
most one interval); without it, polls keep status.progress fresh every `status_seconds`. A
group none of whose workers has ever answered is polled less and less often (hang detection
is inactive for it anyway), and only through its chief until someone answers. A timed-out
request closes its connection, so a stopped worker cannot hide behind a pooled one.

The tracks live only in this process: a restarted operator (or a new leader) starts measuring
afresh, which can delay a hang verdict by one timeout but never hasten it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import aiohttp

from multiworker.api.contract import PROGRESS_PATH
from multiworker.clients import metrics
from multiworker.decide.hang import find_stall, inactive_reason
from multiworker.decide.progress import (
    MAX_REPORT_BYTES,
    BadReport,
    GroupHealth,
    Targets,
    parse_report,
    progress_key,
    progress_of,
    track,
)
from multiworker.decide.stragglers import mark_stragglers, stragglers

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0
STATUS_SECONDS = 10.0  # without hang detection: how fresh status.progress is kept
MIN_SECONDS = 2.0  # the fastest any job is polled
YOUNG_SECONDS = 30.0  # a new group is polled every MIN_SECONDS this long: first steps show fast
SILENT_MAX_SECONDS = 120.0  # a group that never answered is polled at most this rarely
WRITE_SECONDS = 5.0  # progress news wakes a pass at most this often


def poll_interval(targets: Targets, status_seconds: float = STATUS_SECONDS) -> float:
    """Seconds between polls of one job: a fifth of the hang timeout (at least MIN_SECONDS),
    and never rarer than `status_seconds`, which keeps status.progress fresh."""
    if targets.progress_timeout is None:
        return status_seconds
    return min(max(targets.progress_timeout / 5, MIN_SECONDS), status_seconds)


def progress_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip  # IPv6 pod IPs
    return f"http://{host}:{port}{PROGRESS_PATH}"


@dataclass
class JobPolls:
    """One job's polling state."""

    targets: Targets
    due: float  # loop time of the next poll
    born: float = 0.0  # loop time its group was first polled
    health: GroupHealth | None = None
    paused: bool = False  # this instance does not lead the job's namespace right now
    seen: tuple[tuple[int | None, ...], list[int], str | None, str, list[tuple[int, int]],
                datetime | None] = ((), [], None, "", [], None)
    # what the last pass saw: progress, stragglers, ..., workers gone silent; when


@dataclass
class Poller:
    notify: Callable[[Hashable], None]  # wake a job's pass
    clock: Callable[[], datetime]
    status_seconds: float = STATUS_SECONDS
    timeout: float = TIMEOUT_SECONDS
    concurrency: int = 256  # open connections at most, all jobs together
    jobs: dict[Hashable, JobPolls] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _session: aiohttp.ClientSession | None = None
    _running: set[Hashable] = field(default_factory=set)

    # --- what passes tell it ---

    def health(self, key: Hashable) -> GroupHealth | None:
        polls = self.jobs.get(key)
        return polls.health if polls is not None else None

    def after_pass(self, key: Hashable, targets: Targets | None, now: datetime) -> None:
        """Poll what the pass saw from now on (nothing: stop); remember what it wrote."""
        if targets is None:
            self.jobs.pop(key, None)
            return
        loop = asyncio.get_running_loop()
        polls = self.jobs.get(key)
        if polls is None or polls.targets.generation != targets.generation:
            first = loop.time() + random.uniform(0, min(1.0, poll_interval(targets)))
            polls = self.jobs[key] = JobPolls(targets, first, born=loop.time())
            self._changed.set()
        elif polls.paused:
            polls.paused, polls.due = False, loop.time()
            self._changed.set()
        polls.targets = targets
        polls.seen = _news_key(polls) + (now,)

    def forget(self, key: Hashable) -> None:
        self.jobs.pop(key, None)

    def pause(self, key: Hashable) -> None:
        """Stop polling `key` but keep what is known of its workers until the next pass: a
        short lapse of this instance's Lease must not make a worker that stopped answering
        meanwhile look like one that never answered (whose hang nobody can call)."""
        polls = self.jobs.get(key)
        if polls is not None:
            polls.paused = True

    # --- the loop ---

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=4,
                                         keepalive_timeout=60, enable_cleanup_closed=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout),
            auto_decompress=False,
        ) as self._session:
            loop = asyncio.get_running_loop()
            while True:
                now = loop.time()
                due = [k for k, p in self.jobs.items()
                       if p.due <= now and not p.paused and k not in self._running]
                for key in due:
                    self._running.add(key)
                    asyncio.create_task(self._poll_job(key), name=f"poll {key}")
                upcoming = [p.due for k, p in self.jobs.items()
                            if not p.paused and k not in self._running]
                wait = min(upcoming) - now if upcoming else None
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)

    async def _poll_job(self, key: Hashable) -> None:
        try:
            polls = self.jobs.get(key)
            if polls is None:
                return
            targets = polls.targets
            asked = asked_workers(targets, polls.health)
            bodies = await self.fetch_all(asked, targets.port)
            if self.jobs.get(key) is not polls or polls.targets.generation != targets.generation:
                return  # replaced while we polled
            answers = {i: parse_report(b, i, targets.generation) if b is not None else None
                       for (i, _), b in zip(asked, bodies, strict=True)}
            bad = sum(isinstance(a, BadReport) for a in answers.values())
            if bad:
                metrics.BAD_PROGRESS_REPORTS.inc(bad)
            health = track(polls.health, targets, answers, self.clock())
            polls.health = mark_stragglers(health, targets.straggler_threshold)
            polls.due = asyncio.get_running_loop().time() + self._next_interval(polls)
            if news(polls):
                self.notify(key)
        except Exception:  # a bug, not a silent worker: skip this poll rather than blame one
            log.exception("polling progress of %s failed", key)
            polls = self.jobs.get(key)
            if polls is not None:
                polls.due = asyncio.get_running_loop().time() + self.status_seconds
        finally:
            self._running.discard(key)
            self._changed.set()

    def _next_interval(self, polls: JobPolls) -> float:
        """Young groups fast; groups that never answered ever more rarely (a quarter of their
        age, at most SILENT_MAX_SECONDS); the rest at their poll_interval. Jittered."""
        age = asyncio.get_running_loop().time() - polls.born
        base = poll_interval(polls.targets, self.status_seconds)
        if age < YOUNG_SECONDS:
            base = MIN_SECONDS
        elif polls.health is None or not polls.health.ever_reported:
            base = min(max(base, age / 4), SILENT_MAX_SECONDS)
        return base * random.uniform(0.9, 1.1)

    async def fetch_all(self, workers: Sequence[tuple[int, str]], port: int
                        ) -> list[bytes | None]:
        return list(await asyncio.gather(*(self._fetch(progress_url(ip, port))
                                           for _, ip in workers)))

    async def _fetch(self, url: str) -> bytes | None:
        """The body (at most MAX_REPORT_BYTES + 1 bytes: enough to tell it is too big), or
        None when the worker did not answer with 200 in time."""
        assert self._session is not None
        try:
            async with self._session.get(url, allow_redirects=False) as response:
                if response.status != 200:
                    return None
                body = b""
                while len(body) <= MAX_REPORT_BYTES:
                    chunk = await response.content.read(MAX_REPORT_BYTES + 1 - len(body))
                    if not chunk:
                        break
                    body += chunk
                return body
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.debug("GET %s: %s", url, type(e).__name__)
            return None


def asked_workers(targets: Targets, health: GroupHealth | None) -> tuple[tuple[int, str], ...]:
    """Whom one poll asks: every target, except in a group where nobody has answered anything
    yet — there the chief alone (its peers run the same image and start with it), so a group
    that serves no progress costs one connection attempt per poll, not one per worker."""
    if health is not None and health.generation == targets.generation and health.ever_answered:
        return targets.workers
    chief = tuple(w for w in targets.workers if w[0] == 0)
    return chief or targets.workers


def _news_key(polls: JobPolls
              ) -> tuple[tuple[int | None, ...], list[int], str | None, str,
                         list[tuple[int, int]]]:
    t, health = polls.targets, polls.health
    return (progress_key(progress_of(health)), stragglers(health),
            inactive_reason(health, t.progress_timeout, t.port) and "inactive",
            ",".join(sorted({w.last_bad for w in health.workers if w.last_bad}))
            if health else "",
            # a second miss in a row is news too: it ends a silent Lease's veto (policy)
            [(w.index, min(w.missed_polls, 2)) for w in health.workers
             if w.report is not None and not w.answering] if health else [])


def news(polls: JobPolls) -> bool:
    """Whether a pass should look now: a hang; a change of stragglers, of detection state, of
    why reports are bad or of which workers stopped answering (a silent node's Lease is
    explained away only while they answer); or progress not yet written (the group's first
    report at once, then at most every WRITE_SECONDS)."""
    if polls.health is None:
        return False
    if find_stall(polls.health, polls.targets.progress_timeout):
        return True
    progress, straggling, inactive, bad, gone_silent, written_at = polls.seen
    current = _news_key(polls)
    if current[1:] != (straggling, inactive, bad, gone_silent):
        return True
    if current[0] in ((), progress):
        return False
    first = progress == ()
    return first or written_at is None or polls.health.polled_at - written_at >= timedelta(
        seconds=WRITE_SECONDS)
