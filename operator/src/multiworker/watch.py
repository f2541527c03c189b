"""One job's progress watch: polls the workers the last reconcile pass named, keeps their tracks
in memory and says when a pass should look — a hang, a change of stragglers, or progress worth
writing (at most every PROGRESS_WRITE_SECONDS). Between those, polls cost no API calls.

The tracks live only in this process: a restarted operator (or a new leader) starts measuring
afresh, which can delay a hang verdict by one timeout but never hasten it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from multiworker.health import (
    GroupHealth,
    Targets,
    find_stall,
    parse_report,
    progress_key,
    progress_of,
    track,
)
from multiworker.probe import fetch_reports
from multiworker.stragglers import mark_stragglers, stragglers

log = logging.getLogger(__name__)

POLL_SECONDS = 3.0
PROGRESS_WRITE_SECONDS = 5.0

Fetch = Callable[[Sequence[tuple[int, str]], int], Awaitable[dict[int, Any]]]


@dataclass
class ProgressWatch:
    fetch: Fetch = fetch_reports
    poll_seconds: float = POLL_SECONDS
    write_seconds: float = PROGRESS_WRITE_SECONDS
    targets: Targets | None = None
    health: GroupHealth | None = None
    _seen: tuple[tuple[int | None, ...], list[int], datetime | None] = field(
        default=((), [], None))

    def after_pass(self, targets: Targets | None, now: datetime) -> None:
        """Poll what the pass saw from now on; remember what it wrote, to tell news later."""
        self.targets = targets
        if targets is not None and self.health and self.health.generation != targets.generation:
            self.health = None  # a new group: its tracks start afresh
        self._seen = (progress_key(progress_of(self.health)), stragglers(self.health), now)

    async def poll(self, now: Callable[[], datetime]) -> bool:
        """Poll every target once; True when a reconcile pass should run."""
        targets = self.targets
        if targets is None:
            return False
        try:
            raw = await self.fetch(targets.workers, targets.port)
        except Exception:  # a bug, not a silent worker: skip this poll rather than blame one
            log.exception("polling progress failed")
            return False
        answers = {i: parse_report(raw.get(i), i, targets.generation) for i, _ in targets.workers}
        health = track(self.health, targets, answers, now())
        self.health = mark_stragglers(health, targets.straggler_threshold)
        return self.news(self.health.polled_at)

    def news(self, now: datetime) -> bool:
        progress, straggling, written_at = self._seen
        timeout = self.targets.progress_timeout if self.targets else None
        if timeout is not None and find_stall(self.health, timeout):
            return True
        if stragglers(self.health) != straggling:
            return True
        current = progress_key(progress_of(self.health))
        if current in ((), progress):
            return False
        first = progress == ()  # the group's first report: worth writing at once
        return first or written_at is None or now - written_at >= timedelta(
            seconds=self.write_seconds)
