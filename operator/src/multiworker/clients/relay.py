"""Informer threads → the event loop, in batches: events are queued in arrival order and one
loop callback handles all that arrived meanwhile. A group of 1,024 starting sends ~6,000 pod
events; one wake-up of the loop per event (call_soon_threadsafe each) cost CPU for every one
of them (with the work queue's change, 5-10 % of the operator's CPU per pod, bench_scale.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

Manifest = dict[str, Any]
Listener = Callable[[str, Manifest | None, Manifest | None], None]


class LoopRelay:
    """Hands (listener, event) pairs from any thread to the loop, in order, in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque[tuple[Listener, str, Manifest | None, Manifest | None]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self.wakeups = 0  # loop callbacks so far (each handled one batch)

    def to(self, listener: Listener) -> Listener:
        """A listener for an informer: relays its events to `listener` on the loop."""
        def relay(kind: str, old: Manifest | None, new: Manifest | None) -> None:
            with self._lock:
                self._pending.append((listener, kind, old, new))
                if self._scheduled:
                    return
                self._scheduled = True
            self.loop.call_soon_threadsafe(self._drain)
        return relay

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, deque()
            self._scheduled = False
        self.wakeups += 1
        for listener, kind, old, new in batch:
            listener(kind, old, new)
