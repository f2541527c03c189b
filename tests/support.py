"""Test helpers shared by every tier: polling with a deadline instead of fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.5,
    describe: str | Callable[[], str] = "condition",
) -> T:
    """Poll `predicate` until it returns a truthy value and return that value.

    On timeout, fail with `describe` (a string or a callable producing one, so the message can
    show the last state seen — the most useful thing when an integration test goes red).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = describe() if callable(describe) else describe
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
