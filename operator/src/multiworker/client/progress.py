"""What a watched job's status says to someone waiting on it: one `ProgressUpdate` per change,
whether a wait is over, and the `JobFailed` that ends it otherwise. Pure: the status in, the
answer out (`watching.py` brings the statuses).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from multiworker.api.status import TERMINAL_PHASES, JobStatus, Phase
from multiworker.client.errors import JobFailed

FAILED_CONDITION = "Failed"


@dataclass(frozen=True)
class ProgressUpdate:
    """The job at one moment, as a progress display shows it."""

    phase: str | None
    generation: int
    """status.groupGeneration: 0 for the first group, +1 for each restart or resize."""
    ready: str | None
    """Ready workers of the current group out of its size, e.g. `3/3`."""
    step: int | None
    epoch: int | None
    steps_per_second: float | None
    loss: float | None
    time: datetime | None
    """When the chief finished its latest step (status.progress.updatedAt)."""

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def __str__(self) -> str:
        parts = [self.phase or "Pending", f"gen {self.generation}"]
        parts += [f"ready {self.ready}"] if self.ready else []
        parts += [f"step {self.step}"] if self.step is not None else []
        parts += [f"epoch {self.epoch}"] if self.epoch is not None else []
        parts += [f"loss {self.loss:.4g}"] if self.loss is not None else []
        parts += [f"{self.steps_per_second:.3g} steps/s"] if self.steps_per_second else []
        return "  ".join(parts)


def update_of(status: JobStatus) -> ProgressUpdate:
    progress = status.progress
    return ProgressUpdate(
        phase=status.phase.value if status.phase else None,
        generation=status.group_generation,
        ready=status.ready,
        step=progress.step if progress else None,
        epoch=progress.epoch if progress else None,
        steps_per_second=progress.steps_per_second if progress else None,
        loss=progress.loss if progress else None,
        time=progress.updated_at if progress else None,
    )


class Outcome(Enum):
    REACHED = "reached"  # the phase is one waited for
    FAILED = "failed"  # the job Failed, which was not waited for
    SUCCEEDED = "succeeded"  # it Succeeded instead: it will not change again


def phases(until: Iterable[str]) -> frozenset[Phase]:
    """The phases named in `until`; ValueError names one that is not a phase."""
    found = set()
    for name in until:
        try:
            found.add(Phase(name))
        except ValueError:
            known = ", ".join(p.value for p in Phase)
            raise ValueError(f"{name!r} is not a phase; one of {known}") from None
    if not found:
        raise ValueError("nothing to wait for: name at least one phase")
    return frozenset(found)


def wait_outcome(status: JobStatus, until: frozenset[Phase]) -> Outcome | None:
    """Whether a wait for `until` is over with `status`, and how; None: keep waiting."""
    if status.phase in until:
        return Outcome.REACHED
    if status.phase is Phase.FAILED:
        return Outcome.FAILED
    if status.phase is Phase.SUCCEEDED:
        return Outcome.SUCCEEDED
    return None


def failure(job: str, status: JobStatus) -> JobFailed:
    """The error for a job that Failed: its Failed condition's reason and message, and
    status.lastFailure as the API spells it."""
    condition = next((c for c in status.conditions
                      if c.type == FAILED_CONDITION and c.status == "True"), None)
    last = status.last_failure.model_dump(mode="json", by_alias=True, exclude_none=True) \
        if status.last_failure else None
    return JobFailed(job, condition.reason if condition else "",
                     condition.message if condition else "", last)
