"""SIGTERM handling: remember the request so training can stop at a step every worker agrees on.

Stopping alone is not an option in MWMS: the other workers would wait in the next collective
until it times out. So the handler only records the request; training then agrees with its
peers (see `callbacks.PreemptionCallback`), checkpoints, and exits 143.

A trainer stuck in a collective — a peer that hangs, or a node that vanished without resetting
its connections — runs no Python handler until the collective gives up. So a thread also
hears SIGTERM (the interpreter's wakeup fd): when training is stuck (`last_gasp` says so, and
saves this worker's replica: survivors.py), it exits 143 at once instead of waiting for a
kill.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from multiworker.runtime.errors import ExitCode
from multiworker.runtime.exits import exit_now

log = logging.getLogger(__name__)


# How often a trainer looks whether its pod moved to a newer generation (a read of the agent's
# small file on a memory-backed volume).
SUPERSEDED_POLL_SECONDS = 0.1
STUCK_POLL_SECONDS = 0.1  # after a SIGTERM: how often to look whether training is stuck
SUPERSEDED_SAVE_SECONDS = 3.0  # superseded in place: how long to wait to tell it is stuck


class StopSignal:
    """Set by the first SIGTERM; a second SIGTERM exits at once (the caller has lost patience),
    and so does the first when `superseded()` says an in-place restart of the group is what
    stops this trainer (the group is broken: no step can be agreed on). A superseded trainer
    also exits without waiting for any signal, as soon as its pod's agent says so."""

    def __init__(self, superseded: Callable[[], bool] = lambda: False) -> None:
        self._requested = threading.Event()
        self._superseded = superseded
        # Set by training, asked after a SIGTERM at `signalled` (monotonic): True when it saved
        # this worker's replica because training is stuck (exit now), None once training
        # moved since (it stops at an agreed step), False while it cannot tell yet.
        self.last_gasp: Callable[[float], bool | None] = lambda signalled: None
        # Set by training: whether this worker is writing its share of the survivors' copy
        # now (survivors.save), which a superseded trainer lets finish.
        self.saving: Callable[[], bool] = lambda: False

    def install(self) -> None:
        """Takes over SIGTERM and starts watching for a newer generation. Call after TF's
        runtime started: its coordination service installs its own SIGTERM handler, which
        would otherwise swallow the signal."""
        signal.signal(signal.SIGTERM, self._handle)
        threading.Thread(target=self._exit_once_superseded, name="superseded",
                         daemon=True).start()
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._hear_signals, args=(read,), name="sigterm-while-stuck",
                         daemon=True).start()

    def _hear_signals(self, read: int) -> None:
        """SIGTERM heard while the main thread may be stuck in a collective (see the module
        docstring)."""
        while True:
            received = os.read(read, 64)
            if signal.SIGTERM not in received:
                continue
            signalled = time.monotonic()
            while (verdict := self.last_gasp(signalled)) is False:
                time.sleep(STUCK_POLL_SECONDS)
            if verdict:
                log.warning("SIGTERM while training is stuck in a collective: exiting")
                exit_now(ExitCode.PREEMPTED)

    def request(self) -> None:
        self._requested.set()

    def requested(self) -> bool:
        return self._requested.is_set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested():
            log.warning("second SIGTERM: exiting without a checkpoint")
            exit_now(ExitCode.PREEMPTED)
        if self._superseded():
            if not self.saving():
                log.warning("SIGTERM: the group restarts in place as a newer generation: "
                            "exiting at once (a broken group cannot checkpoint together)")
                exit_now(ExitCode.PREEMPTED)
            log.warning("SIGTERM: the group restarts in place as a newer generation: exiting "
                        "once this worker's share of the survivors' copy is written")
            self.request()
            return
        log.warning("SIGTERM: will checkpoint and stop at the next step all workers agree on")
        self.request()

    def _exit_once_superseded(self) -> None:
        """Exit as soon as the pod holds a newer generation, from this thread: the agent
        publishes it before it restarts the pod's containers, and the kubelet's SIGTERM comes
        only after its next look at the containers (up to 1 s) and reaches a Python handler
        only once the main thread runs Python again (not while a collective waits for a peer
        that is gone)."""
        while not self._superseded():
            time.sleep(SUPERSEDED_POLL_SECONDS)
        log.warning("the group restarts in place as a newer generation: exiting at once")
        # A replica stuck in the broken collective is saved first (a moment to tell).
        noticed = time.monotonic()
        while self.last_gasp(noticed) is False and \
                time.monotonic() < noticed + SUPERSEDED_SAVE_SECONDS:
            time.sleep(STUCK_POLL_SECONDS)
        exit_now(ExitCode.PREEMPTED)


CHECK_EVERY_SECONDS = 1.0
MAX_STEPS_BETWEEN_CHECKS = 1000


def steps_between_checks(steps: int, seconds: float) -> int:
    """How many steps until the next stop check, so checks happen about once a second.

    Every worker must check at the same step, so this is computed from values all workers
    share after the check's all-reduce (the steps since the last check and their mean time).
    """
    if seconds <= 0:
        return MAX_STEPS_BETWEEN_CHECKS
    return max(1, min(MAX_STEPS_BETWEEN_CHECKS, math.floor(steps * CHECK_EVERY_SECONDS / seconds)))
