"""What `kubectl mwj` prints for people: a job's status as a summary and its history as a
table, the jobs of a namespace, durations both ways. Pure: every input an argument, `now`
included, so the tables are table-tested.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from multiworker.api.status import GenerationRecord, JobStatus
from multiworker.client.errors import describe_failure

NONE = "-"
HISTORY_HEADER = ["GEN", "WORKERS", "PATH", "STARTED", "RUNNING", "ENDED", "REASON", "RESUMED",
                  "LOST"]
JOBS_HEADER = ["NAME", "PHASE", "GEN", "READY", "RESTARTS", "STEP", "AGE"]
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1, "": 1}


def parse_duration(text: str) -> float:
    """Seconds in `10m`, `600s`, `600`, `1h30m` or `1.5h`; ValueError for anything else."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact or \
            (len(parts) > 1 and any(u == "" for _, u in parts)):
        raise ValueError(f"{text!r} is not a duration: say 600, 600s, 10m or 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def short_duration(seconds: float) -> str:
    """`42s`, `3m12s`, `2h5m`, `3d4h`: the two largest units."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    for big, big_unit, small, small_unit in ((days, "d", hours, "h"), (hours, "h", minutes, "m"),
                                             (minutes, "m", secs, "s")):
        if big:
            return f"{big}{big_unit}{small}{small_unit}" if small else f"{big}{big_unit}"
    return f"{secs}s"


def ago(when: datetime | None, now: datetime) -> str:
    return NONE if when is None else f"{short_duration((now - when).total_seconds())} ago"


def after(when: datetime | None, start: datetime) -> str:
    """`when` as an offset from `start`: `+12s`."""
    return NONE if when is None else f"+{short_duration((when - start).total_seconds())}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            .rstrip() for row in [header, *rows]]


def _or_none(value: object) -> str:
    return NONE if value is None else str(value)


def history_table(history: Sequence[GenerationRecord], now: datetime) -> list[str]:
    """status.history, one row per generation: STARTED relative to now, RUNNING and ENDED as
    offsets from its start."""
    rows = []
    for record in history:
        path = f"{record.path} ({record.trainer_start})" if record.trainer_start else record.path
        rows.append([str(record.generation), str(record.workers), path,
                     ago(record.started, now), after(record.running, record.started),
                     after(record.ended, record.started), _or_none(record.reason),
                     _or_none(record.resumed_from_step), _or_none(record.steps_lost)])
    return table(HISTORY_HEADER, rows)


def _progress(status: JobStatus, now: datetime) -> str | None:
    progress = status.progress
    if progress is None or progress.step is None:
        return None
    parts = [f"step {progress.step}"]
    parts += [f"epoch {progress.epoch}"] if progress.epoch is not None else []
    parts += [f"loss {progress.loss:.4g}"] if progress.loss is not None else []
    parts += [f"accuracy {progress.accuracy:.4g}"] if progress.accuracy is not None else []
    parts += [f"{progress.steps_per_second:.3g} steps/s"] if progress.steps_per_second else []
    if progress.resumed_from_step:
        parts.append(f"resumed from step {progress.resumed_from_step}"
                     + (f" ({progress.resumed_from})" if progress.resumed_from else ""))
    if progress.updated_at:
        parts.append(f"updated {ago(progress.updated_at, now)}")
    return ", ".join(parts)


def status_lines(name: str, status: JobStatus, now: datetime) -> list[str]:
    """`kubectl mwj status`: the facts of the job's status, then its history as a table."""
    phase = status.phase.value if status.phase else "Pending"
    lines = [f"Job:          {name}",
             f"Phase:        {phase} (generation {status.group_generation}, ready "
             f"{status.ready or NONE})",
             f"Restarts:     {status.restarts} (disruptions {status.disruptions})"]
    if status.start_time:
        finished = f", finished {ago(status.completion_time, now)}" \
            if status.completion_time else ""
        lines.append(f"Started:      {ago(status.start_time, now)}{finished}")
    progress = _progress(status, now)
    if progress:
        lines.append(f"Progress:     {progress}")
    failure = status.last_failure
    if failure is not None:
        said = describe_failure(failure.model_dump(by_alias=True))
        lines.append(f"Last failure: {said}, {ago(failure.time, now)}; {failure.action}: "
                     f"{' '.join(failure.message.split())}")
        if failure.steps_lost is not None:
            lines.append(f"              last step {_or_none(failure.last_step)}, "
                         f"{failure.steps_lost} steps lost")
    if status.conditions:
        lines.append("Conditions:")
        lines += ["  " + line for line in table(
            ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
            [[c.type, c.status, c.reason, ago(c.last_transition_time, now), c.message]
             for c in status.conditions])]
    if status.history:
        lines.append("History:")
        lines += ["  " + line for line in history_table(status.history, now)]
    return lines


def jobs_table(jobs: Sequence[tuple[str, JobStatus, datetime | None]], now: datetime) -> list[str]:
    """`kubectl mwj list`: a row per (name, status, creation time)."""
    rows = [[name, status.phase.value if status.phase else "Pending",
             str(status.group_generation), status.ready or NONE, str(status.restarts),
             _or_none(status.progress.step if status.progress else None),
             short_duration((now - created).total_seconds()) if created else NONE]
            for name, status, created in jobs]
    return table(JOBS_HEADER, rows)
