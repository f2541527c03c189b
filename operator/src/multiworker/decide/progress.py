"""Pure reading of the workers' progress reports: the report schema, per-worker tracks and the
group's progress for status (the hang rule is hang.py, stragglers stragglers.py).

No I/O and no clock: the poller (poller.py) fetches the reports and passes every moment in.
A worker *advances* when its step grows or its phase changes (starting → waiting-for-peers →
training → done). Times are the operator's own (when it saw the change), never the workers'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from multiworker.api.contract import FINAL_REPORT_PREFIX, SURVIVOR_SAVED
from multiworker.api.status import ProgressStatus

FINISHED_PHASES = frozenset({"done", "failed"})  # training is over; the pod's exit decides
BEFORE_TRAINING = frozenset({"starting", "waiting-for-peers"})  # nothing restored yet
TRAINING = "training"
MAX_REPORT_BYTES = 64 * 1024  # a report is a few hundred bytes


class PeerWait(BaseModel):
    """A peer endpoint a starting worker still waits for (docs/contracts.md `peers`)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    worker: int = Field(ge=0)
    endpoint: str = Field(max_length=32)
    address: str = Field(default="", max_length=300)
    state: str = Field(max_length=32)
    detail: str = Field(default="", max_length=600)


class Report(BaseModel):
    """One worker's answer to GET /progress (docs/contracts.md): strict types, bounded size
    (the poller reads at most MAX_REPORT_BYTES), nesting refused by the schema itself."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, strict=True,
                              frozen=True, extra="ignore")

    worker_index: int = Field(ge=0)
    generation: int = Field(ge=0)
    phase: str = Field(max_length=64)
    step: int = Field(default=0, ge=0)
    epoch: int = Field(default=0, ge=0)
    steps_per_second: float | None = None
    loss: float | None = None
    accuracy: float | None = None
    last_checkpoint_step: int = Field(default=0, ge=0)
    restored_from_step: int = Field(default=0, ge=0)
    restored_from: str = Field(default="", max_length=128)
    expected_save_seconds: float | None = Field(default=None, ge=0)
    updated_at: float | None = None  # unix seconds of the worker's last step
    peers: tuple[PeerWait, ...] = Field(default=(), max_length=16)

    @field_validator("steps_per_second", "loss", "accuracy", "updated_at", "expected_save_seconds",
                     mode="after")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        """JSON has no NaN or infinity, and the API cannot store them."""
        return value if value is None or math.isfinite(value) else None

    @property
    def updated(self) -> datetime | None:
        return datetime.fromtimestamp(self.updated_at, UTC) if self.updated_at else None


@dataclass(frozen=True)
class BadReport:
    """An answer that is not a report of the polled worker: why, for status and metrics."""

    reason: str


def parse_report(body: bytes, index: int, generation: int) -> Report | BadReport:
    """Worker `index` of `generation`'s report from a raw body, or why it is not one (another
    server on the port, a pod IP reused by another worker, malformed or oversized)."""
    if len(body) > MAX_REPORT_BYTES:
        return BadReport(f"larger than {MAX_REPORT_BYTES // 1024} KiB")
    try:
        report = Report.model_validate_json(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        return BadReport(f"not a progress report ({where}: {first.get('msg', 'invalid')})")
    if (report.worker_index, report.generation) != (index, generation):
        return BadReport(f"from worker-{report.worker_index} of generation "
                         f"{report.generation}, not worker-{index} of generation {generation}")
    return report


Answer = Report | BadReport | None  # None: no answer (refused, timed out, HTTP error)


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
    report: Report | None = None  # its latest good answer, kept while it does not answer
    answering: bool = False  # it answered the latest poll
    advanced_at: datetime | None = None  # when the operator last saw it advance
    silent_since: datetime | None = None  # first unanswered poll since its last answer
    missed_polls: int = 0  # unanswered polls in a row
    bad_reports: int = 0  # answers that were not its report
    last_bad: str = ""  # why the latest one was not
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

    @property
    def ever_answered(self) -> bool:
        """Some worker answered at all, with a report or with something unreadable."""
        return any(w.report is not None or w.bad_reports for w in self.workers)

    @property
    def ever_reported(self) -> bool:
        """Some worker of this group answered with a report: the script serves progress."""
        return any(w.report is not None for w in self.workers)

    @property
    def bad_reports(self) -> int:
        return sum(w.bad_reports for w in self.workers)


def track(previous: GroupHealth | None, targets: Targets, answers: Mapping[int, Answer],
          now: datetime) -> GroupHealth:
    """The group's tracks after one poll: `answers` by worker index."""
    same = previous is not None and previous.generation == targets.generation
    old = {w.index: w for w in previous.workers} if previous is not None and same else {}
    since = previous.running_since if previous is not None and same else None
    workers = tuple(
        _advance(old.get(index) or WorkerTrack(index), answers.get(index), now)
        for index, _ in targets.workers
    )
    running_since = (since or now) if targets.all_running else None
    return GroupHealth(targets.generation, workers, now, running_since)


def _advance(worker: WorkerTrack, answer: Answer, now: datetime) -> WorkerTrack:
    if isinstance(answer, BadReport):
        worker = replace(worker, bad_reports=worker.bad_reports + 1, last_bad=answer.reason)
        answer = None
    if answer is None:
        return replace(worker, answering=False, silent_since=worker.silent_since or now,
                       missed_polls=worker.missed_polls + 1)
    last = worker.report
    advanced = last is None or answer.step > last.step or answer.phase != last.phase
    return replace(worker, report=answer, answering=True, silent_since=None, missed_polls=0,
                   advanced_at=now if advanced else worker.advanced_at)


def progress_of(health: GroupHealth | None) -> ProgressStatus | None:
    """status.progress from the chief's latest report (None until the chief answered, and
    while it starts with nothing trained or restored)."""
    chief = health.worker(0) if health is not None else None
    if chief is None or chief.report is None:
        return None
    r = chief.report
    if r.phase in BEFORE_TRAINING and r.step == 0:
        # Not restored yet: a resuming group would read as step 0, resumed from 0.
        return None
    return ProgressStatus(
        step=r.step, epoch=r.epoch, steps_per_second=r.steps_per_second, loss=r.loss,
        accuracy=r.accuracy, last_checkpoint_step=r.last_checkpoint_step,
        resumed_from_step=r.restored_from_step, resumed_from=r.restored_from or None,
        expected_save_seconds=r.expected_save_seconds, updated_at=r.updated,
    )


def final_progress(termination_message: str) -> ProgressStatus | None:
    """status.progress from the chief's own last report, left as its termination message when
    it exited 0 (contract.FINAL_REPORT_PREFIX): the final figures, which the last poll may
    have missed. None for a script that leaves none (or one that is not a report)."""
    text = termination_message.strip()
    if not text.startswith(FINAL_REPORT_PREFIX):
        return None
    try:
        r = Report.model_validate_json(text.removeprefix(FINAL_REPORT_PREFIX))
    except ValidationError:
        return None
    return ProgressStatus(
        step=r.step, epoch=r.epoch, steps_per_second=r.steps_per_second, loss=r.loss,
        accuracy=r.accuracy, last_checkpoint_step=r.last_checkpoint_step,
        resumed_from_step=r.restored_from_step, resumed_from=r.restored_from or None,
        expected_save_seconds=r.expected_save_seconds, updated_at=r.updated,
    )


def progress_key(progress: ProgressStatus | None) -> tuple[int | None, ...]:
    """The fields whose change is worth a status write (speed, loss and time change always)."""
    if progress is None:
        return ()
    return (progress.step, progress.epoch, progress.last_checkpoint_step,
            progress.resumed_from_step)


_SURVIVOR_SAVED = re.compile(re.escape(SURVIVOR_SAVED) + r" (\d+)")


def last_step_known(reported: int | None, messages: Iterable[str]) -> int | None:
    """The last step a worker is known to have completed: the chief's last report, or a
    survivor's save its termination message names (contract.SURVIVOR_SAVED)."""
    steps = [int(m[1]) for text in messages if (m := _SURVIVOR_SAVED.search(text))]
    if reported is not None:
        steps.append(reported)
    return max(steps, default=None)
