"""status.history: one record per generation of the worker group, kept in the job's status
(the last HISTORY_LIMIT) so the story of its restarts outlives Events, which expire after an
hour. Each function takes the history as written and returns the new one; none changes a
record of another generation than the one it names."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from multiworker.api.conditions import bounded
from multiworker.api.status import HISTORY_LIMIT, HISTORY_MESSAGE_CHARS, GenerationRecord

History = list[GenerationRecord]
Path = Literal["Created", "InPlace", "Recreate"]


def began(history: History | None, generation: int, workers: int, path: Path,
          now: datetime) -> History:
    """The record of `generation` exists: opened now where it is new (a generation already
    recorded keeps its record, whatever a later pass says)."""
    records = list(history or [])
    if any(r.generation == generation for r in records):
        return records
    records.append(GenerationRecord(generation=generation, workers=workers, path=path,
                                    started=now))
    return records[-HISTORY_LIMIT:]


def ended(history: History | None, generation: int, reason: str, message: str,
          now: datetime, last_step: int | None = None) -> History:
    """`generation` ended now, for `reason`: the first end recorded is kept."""
    return _updated(history, generation, lambda r: r.ended is None, ended=now, reason=reason,
                    message=bounded(message, HISTORY_MESSAGE_CHARS), last_step=last_step)


def running(history: History | None, generation: int, workers: int, now: datetime) -> History:
    """All workers of `generation` ran for the first time now."""
    return _updated(history, generation, lambda r: r.running is None, running=now,
                    workers=workers)


def trainer_started(history: History | None, generation: int,
                    how: Literal["warm", "cold"]) -> History:
    """The chief's trainer of `generation`, restarted in place, started `how` (the warm
    launcher's report, which may come after the group runs)."""
    return _updated(history, generation,
                    lambda r: r.path == "InPlace" and r.trainer_start is None,
                    trainer_start=how)


def resumed(history: History | None, generation: int, step: int) -> History:
    """`generation` restored the state of `step` (0: it started afresh)."""
    return _updated(history, generation, lambda r: r.resumed_from_step is None,
                    resumed_from_step=step)


def lost(history: History | None, generation: int, steps: int) -> History:
    """The failure that ended `generation` cost `steps` (known once the next one resumed)."""
    return _updated(history, generation, lambda r: r.steps_lost is None, steps_lost=steps)


def _updated(history: History | None, generation: int, unset: Callable[[GenerationRecord], bool],
             **fields: object) -> History:
    records = list(history or [])
    for i, record in enumerate(records):
        if record.generation == generation and unset(record):
            records[i] = record.model_copy(update=fields)
    return records
