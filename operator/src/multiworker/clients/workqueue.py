"""Which job to reconcile next: a keyed work queue, as in client-go and controller-runtime.

A key is queued at most once however many events arrive for it, and handed to at most one
worker at a time: a key added while its pass runs is queued again when that pass is done. So
two passes over one job can never overlap — not even when a job is deleted and created again
under the same name. Delayed adds (timers, backoff) keep only the earliest time per key.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def jittered(seconds: float, fraction: float = 0.1, rng: random.Random | None = None) -> float:
    """`seconds` give or take `fraction`, so timers of many jobs spread out."""
    spread = seconds * fraction
    return max(0.0, seconds + (rng or random).uniform(-spread, spread))


@dataclass
class WorkQueue(Generic[K]):
    _ready: deque[K] = field(default_factory=deque)
    _queued: set[K] = field(default_factory=set)  # in _ready
    _active: set[K] = field(default_factory=set)  # handed to a worker
    _again: set[K] = field(default_factory=set)  # added while active
    _due: dict[K, float] = field(default_factory=dict)  # earliest delayed add per key
    _timers: list[tuple[float, int, K]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    # Workers waiting in get(), each woken alone: a key wakes one worker, not all of them
    # (8 workers woken per add, each making a new wait task, for thousands of adds a second).
    _waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    # At the earliest timer, and when that is (uvloop's call_at answers a Handle without
    # `when()` for a time already past).
    _alarm: asyncio.Handle | None = None
    _alarm_at: float = 0.0

    def add(self, key: K) -> None:
        """Queue `key` now (a no-op if it is queued; deferred while its pass runs)."""
        self._due.pop(key, None)
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wake_one()

    def add_after(self, key: K, seconds: float) -> None:
        """Queue `key` in `seconds`, unless it is already due sooner."""
        if seconds <= 0:
            self.add(key)
            return
        if key in self._queued or key in self._again:
            return  # its next pass comes sooner, and that pass sets its own timers
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        if key in self._due and self._due[key] <= when:
            return
        self._due[key] = when
        heapq.heappush(self._timers, (when, next(self._seq), key))
        if self._alarm is None or when < self._alarm_at:
            self._set_alarm(loop)

    def forget(self, key: K) -> None:
        """Drop pending timers of a key (its job is gone)."""
        self._due.pop(key, None)

    async def get(self) -> K:
        """The next key to work on; call done(key) when its pass ends."""
        loop = asyncio.get_running_loop()
        while True:
            self._release_due(loop.time())
            if self._ready:
                key = self._ready.popleft()
                self._queued.discard(key)
                self._active.add(key)
                return key
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken and cancelled at once: pass the key on
                raise

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    @property
    def active(self) -> frozenset[K]:
        return frozenset(self._active)

    def waiting(self) -> int:
        """Keys due now and waiting for a worker (delayed adds not yet due are not counted)."""
        return len(self._ready)

    def __len__(self) -> int:
        return len(self._ready) + len(self._due)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _set_alarm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm = None
        if self._timers:
            self._alarm_at = self._timers[0][0]
            self._alarm = loop.call_at(self._alarm_at, self._ring)

    def _ring(self) -> None:
        loop = asyncio.get_running_loop()
        self._release_due(loop.time())
        self._set_alarm(loop)

    def _release_due(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            when, _, key = heapq.heappop(self._timers)
            if self._due.get(key) == when:
                del self._due[key]
                self.add(key)
