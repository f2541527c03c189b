# mypy: disable-error-code="import-untyped"
# mypy: allow-subclassing-any
"""Keras callbacks that `fit` adds: progress reporting, periodic checkpoints, SIGTERM stops,
the collective watchdog's beats.

All of them run on every worker at the same step, which is what lets the checkpoint and the
stop agreement use collectives.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import keras
import tensorflow as tf

from multiworker.runtime.checkpoint import CheckpointStore, step_of
from multiworker.runtime.collective import sum_over_workers
from multiworker.runtime.errors import Preempted
from multiworker.runtime.preemption import StopSignal, steps_between_checks
from multiworker.runtime.progress import ProgressBoard
from multiworker.runtime.survivors import Witness
from multiworker.runtime.watchdog import CollectiveWatchdog

log = logging.getLogger(__name__)


class ProgressCallback(keras.callbacks.Callback):
    """Feeds the /progress board every step (loss, and accuracy when the model compiles an
    `accuracy` metric) and logs one line per epoch."""

    def __init__(self, board: ProgressBoard, epochs: int) -> None:
        super().__init__()
        self._board = board
        self._epochs = epochs

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._board.step_done(
            step_of(self.model), _metric(logs, "loss"), _metric(logs, "accuracy")
        )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._board.epoch_done(epoch + 1)
        state = self._board.snapshot()
        accuracy = _metric(logs, "accuracy")
        log.info(
            "epoch %d/%d done: step %d, loss %s%s, %.1f steps/s",
            epoch + 1,
            self._epochs,
            state["step"],
            _format(_metric(logs, "loss")),
            "" if accuracy is None else f", accuracy {_format(accuracy)}",
            state["stepsPerSecond"],
        )


class WatchdogCallback(keras.callbacks.Callback):
    """Beats the collective watchdog at each step's start and end (watchdog.py): the step's
    all-reduce and the callbacks' collectives between steps are each bounded on their own.
    The first step of a run also traces the step function."""

    def __init__(self, watchdog: CollectiveWatchdog) -> None:
        super().__init__()
        self._watchdog = watchdog
        self._traced = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._watchdog.beat(tracing=not self._traced)
        self._traced = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._watchdog.beat()


class WitnessCallback(keras.callbacks.Callback):
    """Keeps the step each batch completed and what its weights were (survivors.Witness):
    first of the callbacks, before any of them runs a collective that may fail."""

    def __init__(self, witness: Witness) -> None:
        super().__init__()
        self._witness = witness

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._witness.step_done(step_of(self.model))


class CheckpointCallback(keras.callbacks.Callback):
    """Saves every `every_steps` steps, or at each epoch end when `every_steps` is None."""

    def __init__(
        self, store: CheckpointStore, board: ProgressBoard, every_steps: int | None
    ) -> None:
        super().__init__()
        self._store = store
        self._board = board
        self._every_steps = every_steps
        self._expected = False  # the expected save time reported (after the first step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._every_steps and step_of(self.model) % self._every_steps == 0:
            self._save()
        elif not self._expected:
            # After the first step: the optimizer's slots exist only once it ran.
            self._board.expect_save(self._store.expected_save_seconds())
            self._expected = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._every_steps is None:
            self._save()

    def _save(self) -> None:
        self._board.checkpointed(self._store.save())
        self._board.expect_save(self._store.expected_save_seconds())
        self._expected = True


class PreemptionCallback(keras.callbacks.Callback):
    """About once a second, asks all workers whether any got SIGTERM; if so all checkpoint
    at that same step and stop (Preempted, exit 143).

    A check is one small all-reduce (~20 ms for 3 workers on one busy host), too costly for
    every step of a small model; its interval in steps is derived from values all workers
    share after each check, so they keep checking at the same steps.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        stop: StopSignal,
        store: CheckpointStore | None,
        board: ProgressBoard,
        num_workers: int,
    ) -> None:
        super().__init__()
        self._strategy = strategy
        self._num_workers = num_workers
        self._stop = stop
        self._store = store
        self._board = board
        self._interval = 1
        self._steps = 0
        self._since = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps += 1
        if self._steps < self._interval:
            return
        elapsed_ms = int((time.monotonic() - self._since) * 1000)
        requests, total_ms = sum_over_workers(
            self._strategy, [int(self._stop.requested()), elapsed_ms]
        )
        mean_seconds = total_ms / 1000 / self._num_workers
        self._interval = steps_between_checks(self._steps, mean_seconds)
        self._steps, self._since = 0, time.monotonic()
        if requests:
            self._stop_here(requests)

    def _stop_here(self, requests: int) -> None:
        step = step_of(self.model)
        if self._store is None:
            raise Preempted(
                f"SIGTERM on {requests} worker(s); stopped at step {step} "
                "without a checkpoint (MWJ_CHECKPOINT_DIR is not set)"
            )
        if self._store.last_saved_step != step:
            self._board.checkpointed(self._store.save())
        raise Preempted(f"SIGTERM on {requests} worker(s); checkpointed step {step} and stopped")


def _metric(logs: dict[str, Any] | None, name: str) -> float | None:
    """A metric Keras logged (`loss`, or `accuracy` when the model compiles it)."""
    value = (logs or {}).get(name)
    return None if value is None else float(value)


def _format(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.4g}"
