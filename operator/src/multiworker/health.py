"""Pure interpretation of the workers' progress reports: per-worker tracks, the group's progress
and the hang rule (stragglers: stragglers.py).

No I/O and no clock: the poller (watch.py) fetches the reports (probe.py) and passes every
moment in. A worker *advances* when its step grows or its phase changes (starting →
waiting-for-peers → training → done); so each start-up stage, and the wait for the first
answer, gets the whole spec.health.progressTimeoutSeconds. Times are the operator's own (when
it saw the change), never the workers' clocks; a freshly started operator measures from its
first poll.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from multiworker.status import ProgressStatus

FINISHED_PHASES = frozenset({"done", "failed"})  # training is over; the pod's exit decides
TRAINING = "training"
_NEVER = datetime.max.replace(tzinfo=UTC)
_NAMED_OTHERS = 3  # a hang message names the first worker and this many more


@dataclass(frozen=True)
class Report:
    """One worker's answer to GET /progress (docs/contracts.md)."""

    worker_index: int
    generation: int
    phase: str
    step: int
    epoch: int
    steps_per_second: float
    loss: float | None
    last_checkpoint_step: int
    restored_from_step: int
    updated_at: datetime | None
    accuracy: float | None = None


def parse_report(raw: Any, index: int, generation: int) -> Report | None:
    """The report of worker `index` of `generation`, or None for anything else (another
    server on the port, a pod IP reused by a different worker, a malformed body)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        report = Report(
            worker_index=int(raw["workerIndex"]),
            generation=int(raw["generation"]),
            phase=str(raw["phase"]),
            step=int(raw.get("step") or 0),
            epoch=int(raw.get("epoch") or 0),
            steps_per_second=_finite(raw.get("stepsPerSecond")) or 0.0,
            loss=_finite(raw.get("loss")),
            last_checkpoint_step=int(raw.get("lastCheckpointStep") or 0),
            restored_from_step=int(raw.get("restoredFromStep") or 0),
            updated_at=_unix_time(raw.get("updatedAt")),
            accuracy=_finite(raw.get("accuracy")),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if (report.worker_index, report.generation) != (index, generation):
        return None
    return report


@dataclass(frozen=True)
class Targets:
    """What the last reconcile pass saw to poll: the running workers of the current group."""

    generation: int
    port: int
    workers: tuple[tuple[int, str], ...]  # (worker index, pod IP)
    all_running: bool  # every worker of the group runs: the hang clock may start
    progress_timeout: int | None = None  # spec.health.progressTimeoutSeconds
    straggler_threshold: float | None = None  # spec.health.stragglerThreshold


@dataclass(frozen=True)
class WorkerTrack:
    """What the operator knows about one worker's progress."""

    index: int
    report: Report | None = None  # its latest answer, kept while it does not answer
    answering: bool = False  # it answered the latest poll
    advanced_at: datetime | None = None  # when the operator last saw it advance
    silent_since: datetime | None = None  # first unanswered poll since its last answer
    slow_polls: int = 0  # polls in a row below the straggler threshold
    fast_polls: int = 0  # polls in a row at or above it
    straggling: bool = False

    @property
    def finished(self) -> bool:
        return self.report is not None and self.report.phase in FINISHED_PHASES


@dataclass(frozen=True)
class GroupHealth:
    """The tracks of one group generation, as of the latest poll."""

    generation: int
    workers: tuple[WorkerTrack, ...]
    polled_at: datetime
    running_since: datetime | None = None  # first poll that saw every worker running
    median_rate: float | None = None  # median steps/s of the training workers

    def worker(self, index: int) -> WorkerTrack | None:
        return next((w for w in self.workers if w.index == index), None)


def track(
    previous: GroupHealth | None, targets: Targets, answers: Mapping[int, Report | None],
    now: datetime,
) -> GroupHealth:
    """The group's tracks after one poll: `answers` by worker index (None: no answer)."""
    same = previous is not None and previous.generation == targets.generation
    old = {w.index: w for w in previous.workers} if previous is not None and same else {}
    since = previous.running_since if previous is not None and same else None
    workers = tuple(
        _advance(old.get(index) or WorkerTrack(index), answers.get(index), now)
        for index, _ in targets.workers
    )
    running_since = (since or now) if targets.all_running else None
    return GroupHealth(targets.generation, workers, now, running_since)


def _advance(worker: WorkerTrack, report: Report | None, now: datetime) -> WorkerTrack:
    if report is None:
        return replace(worker, answering=False, silent_since=worker.silent_since or now)
    last = worker.report
    advanced = last is None or report.step > last.step or report.phase != last.phase
    return replace(worker, report=report, answering=True, silent_since=None,
                   advanced_at=now if advanced else worker.advanced_at)


# --- progress ---


def progress_of(health: GroupHealth | None) -> ProgressStatus | None:
    """status.progress from the chief's latest report (None until the chief answered)."""
    chief = health.worker(0) if health is not None else None
    if chief is None or chief.report is None:
        return None
    r = chief.report
    return ProgressStatus(
        step=r.step, epoch=r.epoch, steps_per_second=r.steps_per_second, loss=r.loss,
        accuracy=r.accuracy,
        last_checkpoint_step=r.last_checkpoint_step, resumed_from_step=r.restored_from_step,
        updated_at=r.updated_at,
    )


def progress_key(progress: ProgressStatus | None) -> tuple[int | None, ...]:
    """The fields whose change is worth a status write (speed, loss and time change always)."""
    if progress is None:
        return ()
    return (progress.step, progress.epoch, progress.last_checkpoint_step,
            progress.resumed_from_step)


# --- hangs ---


@dataclass(frozen=True)
class Stall:
    """No worker advanced for `quiet`: `first` is the worker whose progress stopped first."""

    first: WorkerTrack
    stopped_at: datetime  # when `first` last advanced (or the clock started)
    quiet: timedelta  # since the last advance of any worker, up to the latest poll
    others: tuple[WorkerTrack, ...]


def find_stall(health: GroupHealth | None, timeout_seconds: int) -> Stall | None:
    """The hang rule: the whole group running, and no unfinished worker advanced for
    `timeout_seconds` up to the latest poll (a worker that does not answer does not advance).
    The clock starts when every worker was seen running."""
    if health is None or health.running_since is None:
        return None
    start = health.running_since
    active = [w for w in health.workers if not w.finished]
    if not active:
        return None
    last = {w.index: max(w.advanced_at or start, start) for w in active}
    quiet = health.polled_at - max(last.values())
    if quiet < timedelta(seconds=timeout_seconds):
        return None

    def stopped_first(w: WorkerTrack) -> tuple[datetime, bool, datetime, int, int]:
        step = w.report.step if w.report is not None else -1
        return last[w.index], w.answering, w.silent_since or _NEVER, step, w.index

    first = min(active, key=stopped_first)
    others = tuple(sorted((w for w in active if w is not first), key=stopped_first))
    return Stall(first, last[first.index], quiet, others)


def describe_stall(stall: Stall) -> str:
    """`no progress for 20s: worker-1 stopped first at step 63 (unreachable since 12:00:01);
    worker-0 at step 63 (answering)`."""
    named = [_worker_state(w, first=False) for w in stall.others[:_NAMED_OTHERS]]
    if len(stall.others) > _NAMED_OTHERS:
        named.append(f"{len(stall.others) - _NAMED_OTHERS} more workers stopped later")
    others = "; ".join(named)
    return (f"no progress for {_seconds(stall.quiet)}: {_worker_state(stall.first, first=True)}"
            + (f"; {others}" if others else ""))


def _worker_state(w: WorkerTrack, *, first: bool) -> str:
    who = f"worker-{w.index}" + (" stopped first" if first else "")
    if w.report is None:
        return f"{who} without ever answering (polled since {_clock(w.silent_since)})"
    phase = f", {w.report.phase}" if w.report.phase != TRAINING else ""
    how = f"unreachable since {_clock(w.silent_since)}" if w.silent_since else "answering"
    return f"{who} at step {w.report.step} ({how}{phase})"


# --- helpers ---


def _finite(value: Any) -> float | None:
    """A float the API can store (JSON has no NaN or infinity)."""
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _unix_time(value: Any) -> datetime | None:
    seconds = _finite(value)
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


def _seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():.0f}s"


def _clock(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%H:%M:%S") if moment is not None else "?"
