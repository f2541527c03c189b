"""Test helpers shared by every tier: polling with a deadline instead of fixed sleeps, and how
a test says what it shares with the others (`make test` runs them in pytest-xdist workers)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import TypeVar

import pytest

T = TypeVar("T")

# The node's four GPUs are one pool, and some tests wait for all of them to be free: the tests
# that take GPUs hold one lock while they run (tests/conftest.py `shared`), one at a time.
USES_NODE_GPUS = pytest.mark.shares("node-gpus")


def alone(reason: str) -> pytest.MarkDecorator:
    """Run with no other test on the cluster (`make test` runs these before the parallel ones,
    one at a time); the reason says what the test would do to the others, or they to it."""
    return pytest.mark.alone(reason)


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


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on now. Each socket stays bound until all
    are chosen: closed one at a time, the kernel may hand the same port out twice (it did in CI,
    making a worker's gRPC port its own progress port)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def has_failed(request: pytest.FixtureRequest) -> bool:
    """In a fixture's teardown: whether the test's setup or call failed (the reports
    tests/conftest.py `pytest_runtest_makereport` keeps on the item)."""
    return any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
               for when in ("setup", "call"))
