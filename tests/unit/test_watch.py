"""When the progress watch asks for a pass: hangs and stragglers at once, progress throttled."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from multiworker.health import Targets
from multiworker.watch import ProgressWatch

from tests.unit.builders import at
from tests.unit.test_health import raw

TARGETS = Targets(generation=0, port=8471, workers=((0, "10.88.0.5"), (1, "10.88.0.6")),
                  all_running=True, progress_timeout=20)


class Answers:
    def __init__(self) -> None:
        self.bodies: dict[int, Any] = {}

    async def fetch(self, workers: Any, port: int) -> dict[int, Any]:
        assert port == 8471
        return dict(self.bodies)


def poll(watch: ProgressWatch, moment: datetime) -> bool:
    return asyncio.run(watch.poll(lambda: moment))


def test_progress_is_news_at_once_first_then_at_most_every_write_interval() -> None:
    answers = Answers()
    watch = ProgressWatch(answers.fetch)
    watch.after_pass(TARGETS, at(0))
    answers.bodies = {0: raw(0, step=0), 1: raw(1, step=0)}
    assert poll(watch, at(1))  # the first report
    watch.after_pass(TARGETS, at(1))
    assert not poll(watch, at(2))  # nothing new
    answers.bodies = {0: raw(0, step=5), 1: raw(1, step=5)}
    assert not poll(watch, at(3))  # new, but written 2s ago
    assert poll(watch, at(6))


def test_a_stall_is_news_and_a_new_generation_starts_over() -> None:
    answers = Answers()
    watch = ProgressWatch(answers.fetch)
    watch.after_pass(TARGETS, at(0))
    answers.bodies = {0: raw(0, step=7), 1: raw(1, step=7)}
    poll(watch, at(1))
    watch.after_pass(TARGETS, at(1))
    answers.bodies = {0: raw(0, step=7)}
    assert not poll(watch, at(20))
    assert poll(watch, at(21))
    assert watch.health is not None and watch.health.polled_at == at(21)
    watch.after_pass(Targets(1, 8471, ((0, "10.88.0.7"),), False), at(22))
    assert watch.health is None


def test_nothing_to_poll_without_targets() -> None:
    watch = ProgressWatch(Answers().fetch)
    watch.after_pass(None, at(0))
    assert not poll(watch, at(0) + timedelta(seconds=5))


def test_a_failing_poll_is_skipped_not_counted_as_silence() -> None:
    async def broken(workers: Any, port: int) -> dict[int, Any]:
        raise RuntimeError("bug")

    watch = ProgressWatch(broken)
    watch.after_pass(TARGETS, at(0))
    assert not poll(watch, at(30)) and watch.health is None
