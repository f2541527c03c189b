"""Bounding collectives with one thread: abort them when training stops moving.

A collective waits for every peer. Heartbeats to the coordination service report a dead or
stopped peer (strategy.py), but not a stopped worker 0: it runs that service, so nobody
reports it, and without a bound its peers would wait forever. TensorFlow's own bound,
`CommunicationOptions(timeout_seconds=...)`, starts one thread per collective that lives for
the whole timeout, even after the collective completed (its docstring: "an overhead of
timeout_seconds * num_collectives_per_second more threads"): at 300 s and a few hundred
collectives a second, a trainer held 10,071 threads after 49 s of training and died of it.

Instead, training beats this watchdog at each step's start and end and around its other
collective phases (agreement, restore, saves). One thread per process wakes at the deadline
— the last beat plus MWJ_COLLECTIVE_TIMEOUT_SECONDS — and, while armed, aborts the process's
collectives (`context.abort_collective_ops`): the waiting collective raises
DeadlineExceededError, as TensorFlow's timeout did, and the trainer exits 4 after its survivor
save. The first step also traces the step function, so its interval is allowed twice the
bound. Unarmed (outside `fit` and `save_model`), nothing is ever aborted: an abort
is final for the process's collectives, so it must hit only a wait that is really stuck.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# The first step also traces the step function: its interval may take this many bounds.
FIRST_STEP_BOUNDS = 2.0


def seconds_left(last_beat: float, allowance: float, now: float) -> float:
    """Seconds until the deadline `allowance` after `last_beat` (<= 0: past it)."""
    return last_beat + allowance - now


class CollectiveWatchdog:
    """Aborts this process's collectives when, while armed, no beat came within the bound."""

    def __init__(self, bound: float, abort: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bound = bound
        self._abort = abort or abort_collectives
        self._clock = clock
        self._wake = threading.Condition()
        self._armed = 0  # nesting depth of `armed()`
        self._last_beat = 0.0
        self._allowance = bound
        self._thread: threading.Thread | None = None
        self.fired: str | None = None  # the abort's message, once it fired

    def beat(self, tracing: bool = False) -> None:
        """Training moved: a new interval of at most the bound starts (`tracing`: the interval
        also traces a step function, FIRST_STEP_BOUNDS of it). Costs two attribute writes
        (the watchdog thread reads them when it wakes), so it may run every step."""
        self._allowance = self.bound * (FIRST_STEP_BOUNDS if tracing else 1.0)
        self._last_beat = self._clock()

    @contextmanager
    def armed(self) -> Iterator[None]:
        """While inside, a wait of more than the bound between beats aborts the collectives.
        Arming is a beat. Nests."""
        with self._wake:
            if self._armed == 0:
                self.beat()
            self._armed += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="collective-watchdog",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()
        try:
            yield
        finally:
            with self._wake:
                self._armed -= 1

    def _watch(self) -> None:
        with self._wake:
            while self.fired is None:
                if not self._armed:
                    self._wake.wait()
                    continue
                left = seconds_left(self._last_beat, self._allowance, self._clock())
                if left > 0:
                    self._wake.wait(left)
                    continue
                self.fired = (
                    f"no training progress for {self._clock() - self._last_beat:.0f}s "
                    f"(MWJ_COLLECTIVE_TIMEOUT_SECONDS {self.bound:g}): collective timed out "
                    "waiting for a peer that stopped answering (a stopped worker 0 is "
                    "reported by no heartbeat)"
                )
                log.warning("aborting this worker's collectives: %s", self.fired)
                self._abort(self.fired)


def abort_collectives(message: str) -> None:
    """Every pending and later collective of this process fails with DeadlineExceededError."""
    import tensorflow as tf  # only a trainer that armed the watchdog has imported it
    from tensorflow.python.eager import context as tf_context

    tf_context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)
