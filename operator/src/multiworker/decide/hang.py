"""The hang rule, in one place: when a running group counts as hung, who stopped first, and
when hang detection cannot work at all.

Pure: it reads the tracks the poller keeps (progress.py) and returns a verdict. The clock
starts when every worker was seen running, so each start-up stage gets the whole
spec.health.progressTimeoutSeconds. A worker that does not answer does not advance — that is
how a stopped (SIGSTOP) or wedged worker is told apart from a slow one: a slow worker still
answers, and its step still grows.

"Never reported" is not "stopped progressing": while no worker of the group has answered
with a report (the script serves no /progress, or it is still importing), nothing is judged
and the status says detection is inactive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from multiworker.decide.progress import TRAINING, GroupHealth, WorkerTrack

_NEVER = datetime.max.replace(tzinfo=UTC)
_NAMED_OTHERS = 3  # a hang message names the first worker and this many more


@dataclass(frozen=True)
class Stall:
    """No worker advanced for `quiet`: `first` is the worker whose progress stopped first."""

    first: WorkerTrack
    stopped_at: datetime  # when `first` last advanced (or the clock started)
    quiet: timedelta  # since the last advance of any worker, up to the latest poll
    others: tuple[WorkerTrack, ...]

    def describe(self) -> str:
        """`no progress for 20s: worker-1 stopped first at step 63 (unreachable since
        12:00:01); worker-0 at step 63 (answering)`."""
        named = [_worker_state(w, first=False) for w in self.others[:_NAMED_OTHERS]]
        if len(self.others) > _NAMED_OTHERS:
            named.append(f"{len(self.others) - _NAMED_OTHERS} more workers stopped later")
        others = "; ".join(named)
        return (f"no progress for {self.quiet.total_seconds():.0f}s: "
                f"{_worker_state(self.first, first=True)}" + (f"; {others}" if others else ""))


def inactive_reason(health: GroupHealth | None, timeout_seconds: int | None,
                    port: int) -> str | None:
    """Why hang detection cannot judge this group yet (None: it can, or it is off)."""
    if timeout_seconds is None or health is None or health.running_since is None:
        return None
    if health.ever_reported:
        return None
    waited = health.polled_at - health.running_since
    if waited < timedelta(seconds=timeout_seconds):
        return None  # still starting: nobody expects a report yet
    return (f"hang detection is inactive: no worker of generation {health.generation} has "
            f"answered GET /progress on port {port} in {waited.total_seconds():.0f}s; "
            "the training script serves no progress report (multiworker.runtime does), so "
            "spec.health.progressTimeoutSeconds restarts nothing")


def find_stall(health: GroupHealth | None, timeout_seconds: int | None) -> Stall | None:
    """The whole group running, some worker has reported, and no unfinished worker advanced
    for `timeout_seconds` up to the latest poll."""
    if timeout_seconds is None or health is None or health.running_since is None:
        return None
    if not health.ever_reported:
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


def _worker_state(w: WorkerTrack, *, first: bool) -> str:
    who = f"worker-{w.index}" + (" stopped first" if first else "")
    if w.report is None:
        return f"{who} without ever answering (polled since {_clock(w.silent_since)})"
    phase = f", {w.report.phase}" if w.report.phase != TRAINING else ""
    how = f"unreachable since {_clock(w.silent_since)}" if w.silent_since else "answering"
    return f"{who} at step {w.report.step} ({how}{phase})"


def _clock(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%H:%M:%S") if moment is not None else "?"
