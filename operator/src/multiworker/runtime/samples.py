# mypy: disable-error-code="import-untyped"
"""Where the sample stream stands, saved with every checkpoint, for a group whose size may
change (spec.elastic, `fit(..., global_batch=...)`).

A run of fixed size finds its place in the input from the step alone (step × global batch).
An elastic group under ScaleLearningRate trains with a global batch that follows its size, so
the samples trained are the sum over its generations; that count is saved beside the model
(`samples` in every checkpoint and survivor save, at the step the save is of) and the next
generation reads on from it: no sample skipped or seen twice across a resize.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import tensorflow as tf

log = logging.getLogger(__name__)

KEY = "samples"
_VARIABLE = f"{KEY}/.ATTRIBUTES/VARIABLE_VALUE"


class SampleCount:
    """Samples trained before each step of this generation: `begin` at the restored step,
    then `at(step)` = the restored count + the steps since × this generation's global batch."""

    def __init__(self) -> None:
        self.variable = tf.Variable(-1, dtype=tf.int64, trainable=False, name=KEY)
        self.start_step = 0
        self.start = 0
        self.global_batch = 0

    def begin(self, restored_step: int, global_batch: int, full_batch: int) -> int:
        """Starts counting at `restored_step`; returns the samples trained before it. A
        checkpoint saved without a count (written before this runtime counted, or by a run
        that did not) is taken to have trained every step at the full size."""
        saved = int(self.variable.numpy())
        self.start_step = restored_step
        self.start = saved if saved >= 0 else restored_step * full_batch
        self.global_batch = global_batch
        return self.start

    def at(self, step: int) -> int:
        return self.start + (step - self.start_step) * self.global_batch

    def mark(self, step: int) -> None:
        """Sets the saved count to the one at `step`, right before a save of that step."""
        self.variable.assign(self.at(step))


def checkpointed(model: keras.Model, count: SampleCount | None, path: str | None = None
                 ) -> tf.train.Checkpoint:
    """The objects a checkpoint holds: the model and its optimizer, and the sample count when
    the run keeps one and `path` (a save to restore from; None: one to write) has it."""
    objects: dict[str, Any] = {"model": model, "optimizer": model.optimizer}
    if count is not None and (path is None or _has_count(path)):
        objects[KEY] = count.variable
    return tf.train.Checkpoint(**objects)


def _has_count(path: str) -> bool:
    return any(name == _VARIABLE for name, _ in tf.train.list_variables(path))
