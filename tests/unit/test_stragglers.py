"""The pure straggler rule: below threshold × median for several polls in a row, with hysteresis."""

from __future__ import annotations

from multiworker.decide.progress import GroupHealth, Targets, track
from multiworker.decide.stragglers import (
    STRAGGLER_POLLS,
    describe_recovered,
    describe_straggler,
    mark_stragglers,
    stragglers,
)

from tests.unit.builders import at
from tests.unit.test_progress import report

THREE = Targets(generation=0, port=8471, all_running=True, straggler_threshold=0.5,
                workers=((0, "10.88.0.5"), (1, "10.88.0.6"), (2, "10.88.0.7")))


def poll(health: GroupHealth | None, rates: list[float | None], seconds: float,
         threshold: float | None = 0.5) -> GroupHealth:
    """One poll: each worker's steps/s (None: it did not answer)."""
    answers = {i: None if rate is None else report(i, step=int(seconds) + 1, stepsPerSecond=rate)
               for i, rate in enumerate(rates)}
    return mark_stragglers(track(health, THREE, answers, at(seconds)), threshold)


def test_slow_for_several_polls_in_a_row_is_a_straggler() -> None:
    health = None
    for n in range(STRAGGLER_POLLS - 1):
        health = poll(health, [4.0, 1.0, 4.2], n)
        assert stragglers(health) == []
    health = poll(health, [4.0, 1.0, 4.2], 9)
    assert stragglers(health) == [1] and health.median_rate == 4.0
    assert describe_straggler(health, 1, 0.5) == (
        "worker-1 is straggling: 1 steps/s, below 0.5 × the group's median of 4 steps/s for "
        "3 polls in a row (spec.health.stragglerThreshold); not restarting")


def test_one_fast_poll_does_not_clear_it_but_several_do() -> None:
    health = None
    for n in range(STRAGGLER_POLLS):
        health = poll(health, [4.0, 1.0, 4.0], n)
    health = poll(health, [4.0, 3.9, 4.0], 10)
    assert stragglers(health) == [1]
    health = poll(health, [4.0, 1.0, 4.0], 11)  # slow again: the fast streak restarts
    for n in range(STRAGGLER_POLLS):
        health = poll(health, [4.0, 3.9, 4.0], 20 + n)
    assert stragglers(health) == []
    assert describe_recovered(health, 1) == (
        "worker-1 is no longer straggling: 3.9 steps/s, group median 4 steps/s")


def test_a_silent_worker_keeps_its_count_and_is_no_straggler_for_it() -> None:
    health = None
    for n in range(STRAGGLER_POLLS - 1):
        health = poll(health, [4.0, 1.0, 4.0], n)
    health = poll(health, [4.0, None, 4.0], 5)
    assert stragglers(health) == [] and health.workers[1].slow_polls == STRAGGLER_POLLS - 1
    health = poll(health, [4.0, 1.0, 4.0], 6)
    assert stragglers(health) == [1]


def test_off_without_a_threshold_or_a_second_rate() -> None:
    health = None
    for n in range(STRAGGLER_POLLS + 1):
        health = poll(health, [4.0, 1.0, 4.0], n, threshold=None)
    assert stragglers(health) == [] and health.median_rate is None
    for n in range(STRAGGLER_POLLS + 1):
        health = poll(health, [4.0, None, None], 10 + n)
    assert stragglers(health) == []
