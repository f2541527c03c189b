"""The collective watchdog (runtime/watchdog.py): it aborts only an armed wait past its bound."""

from __future__ import annotations

import threading
import time

import pytest
from multiworker.runtime.watchdog import (
    FIRST_STEP_BOUNDS,
    CollectiveWatchdog,
    seconds_left,
)

BOUND = 0.3


@pytest.mark.parametrize(
    ("last_beat", "allowance", "now", "left"),
    [
        (100.0, 15.0, 100.0, 15.0),  # just beaten
        (100.0, 15.0, 110.0, 5.0),
        (100.0, 15.0, 115.0, 0.0),  # at the deadline: due
        (100.0, 30.0, 120.0, 10.0),  # a first step's longer allowance
        (100.0, 15.0, 130.0, -15.0),  # long past
    ],
)
def test_seconds_left(last_beat: float, allowance: float, now: float, left: float) -> None:
    assert seconds_left(last_beat, allowance, now) == left


class Aborts:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.fired = threading.Event()

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        self.fired.set()


def test_an_armed_wait_past_the_bound_aborts_once_and_says_why() -> None:
    aborts = Aborts()
    watchdog = CollectiveWatchdog(BOUND, abort=aborts)
    started = time.monotonic()
    with watchdog.armed():
        assert aborts.fired.wait(5)
        waited = time.monotonic() - started
        time.sleep(2 * BOUND)
    assert BOUND <= waited < BOUND + 10  # the upper end: a loaded machine's thread wake-up
    assert len(aborts.messages) == 1
    assert "collective timed out" in aborts.messages[0]
    assert "MWJ_COLLECTIVE_TIMEOUT_SECONDS 0.3" in aborts.messages[0]
    assert watchdog.fired == aborts.messages[0]


def test_beats_keep_it_quiet_and_it_never_fires_unarmed() -> None:
    aborts = Aborts()
    bound = 2.0  # ten times a step's sleep: a loaded machine may oversleep a step
    watchdog = CollectiveWatchdog(bound, abort=aborts)
    with watchdog.armed():
        for _ in range(15):  # 1.5 bounds of steps, each well inside it
            time.sleep(bound / 10)
            watchdog.beat()
    time.sleep(1.5 * bound)  # disarmed: a long pause (the chief saving, user code) is fine
    assert aborts.messages == []


def test_a_first_step_may_take_longer_for_tracing() -> None:
    aborts = Aborts()
    watchdog = CollectiveWatchdog(BOUND, abort=aborts)
    with watchdog.armed():
        watchdog.beat(tracing=True)
        assert not aborts.fired.wait(BOUND * (FIRST_STEP_BOUNDS - 0.5))
        assert aborts.fired.wait(10)


def test_one_thread_however_often_it_is_armed() -> None:
    watchdog = CollectiveWatchdog(BOUND, abort=Aborts())
    before = threading.active_count()
    for _ in range(50):
        with watchdog.armed(), watchdog.armed():
            watchdog.beat()
    assert threading.active_count() == before + 1
