"""A job's Events as a person reads them: oldest first, each with the time it last happened.
Pure: the API's raw Event objects in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multiworker.api import names

_EARLIEST = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Event:
    """One core/v1 Event about the job (the operator records them: group created, restarting
    and why, succeeded)."""

    time: datetime | None
    """When it last happened: lastTimestamp, else eventTime, else firstTimestamp."""
    type: str
    """Normal or Warning."""
    reason: str
    message: str
    count: int = 1

    def __str__(self) -> str:
        when = self.time.strftime("%H:%M:%S") if self.time else "--:--:--"
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{when} {self.type} {self.reason}: {self.message}{times}"


def event_selector(job: str) -> str:
    return f"involvedObject.name={job},involvedObject.kind={names.KIND}"


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def event_of(raw: Mapping[str, Any]) -> Event:
    meta = raw.get("metadata") or {}
    time = next((t for t in (parse_time(raw.get(k)) for k in
                             ("lastTimestamp", "eventTime", "firstTimestamp")) if t),
                parse_time(meta.get("creationTimestamp")))
    series = raw.get("series") or {}
    return Event(time=time, type=str(raw.get("type", "")), reason=str(raw.get("reason", "")),
                 message=str(raw.get("message", "")),
                 count=int(series.get("count") or raw.get("count") or 1))


def events_of(items: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Events oldest first (one without a time first of all)."""
    return sorted((event_of(item) for item in items), key=lambda e: e.time or _EARLIEST)
