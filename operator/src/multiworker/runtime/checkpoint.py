# mypy: disable-error-code="import-untyped"
"""Checkpoints for resuming a group, and the final model, written the MWMS way.

Every worker must take part in a save (TF requires it: saving distributed variables may run
collectives), but only the chief (worker 0) writes to the real path; the others write to a
local temp dir that is deleted right away (the `_is_chief` / write_filepath pattern of TF's
multi-worker Keras tutorial). All workers restore from the chief's MWJ_CHECKPOINT_DIR, so it
must be storage every worker can read; `fit` checks that they all see it and found the same
step. The chief records the job's identity beside its checkpoints (ownership.py), so that no
job restores another's state by accident, and no save starts once a newer generation of the
job claimed the directory (fence.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import keras
import tensorflow as tf

from multiworker.runtime import fence, survivors
from multiworker.runtime.agreement import stop_if_superseded
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.ownership import JobIdentity, restore_source, write_identity
from multiworker.runtime.samples import SampleCount, checkpointed

log = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2  # the previous one survives a crash in the middle of writing the latest


class CheckpointStore:
    """Model + optimizer state; the step is the optimizer's iteration count, saved with it;
    and the sample count of a run that keeps one (samples.py)."""

    def __init__(self, model: keras.Model, config: RuntimeConfig, directory: str,
                 samples: SampleCount | None = None) -> None:
        self._model = model
        self._samples = samples
        self._config = config
        self._directory = directory
        self._write_dir = directory if config.is_chief else _temp_dir(config, "checkpoint")
        self._checkpoint = checkpointed(model, samples)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self._write_dir, max_to_keep=KEEP_CHECKPOINTS
        )
        self._identity_written = False
        self._fence = fence.own_fence(config)
        self._survivor: survivors.SurvivorSave | None = None
        self.last_saved_step = 0

    def find(self) -> tuple[str | None, int]:
        """The checkpoint restore() would load — this job's latest, or on a deliberate resume
        the other run's (ownership.restore_source), or a survivor's save of a higher step
        (survivors.py) — and its step, without touching the model; (None, 0) when there is
        none."""
        source = restore_source(self._config, tf.train.latest_checkpoint)
        step = step_in_name(source)
        survivor = survivors.newest(self._directory, self._config.job_uid)
        if survivor is not None and survivor.step > step:
            self._survivor = survivor
            return survivor.path, survivor.step
        return source, step

    def origin(self, source: str | None) -> str:
        """Where `source` (from find()) came from, in words: a survivor, or a checkpoint."""
        if self._survivor is not None and source == self._survivor.path:
            return self._survivor.describe()
        return "checkpoint" if source is not None else "none"

    def restore(self, source: str | None) -> int:
        """Loads `source` (from find()); returns the restored step (0 if none). Builds the
        optimizer's slots under the strategy first, which runs collectives: call it only once
        every worker agreed on the step (agreement.check_same_directory_and_step)."""
        if source is None:
            return 0
        with self._model.distribute_strategy.scope():
            # Slot variables must exist before restoring into them (Keras builds them lazily).
            self._model.optimizer.build(self._model.trainable_variables)
        if self._survivor is not None and source == self._survivor.path:
            # Written without the manager's save counter (survivors.save); its optimizer may
            # have counted the step that failed: the save names the step its weights reflect.
            checkpointed(self._model, self._samples, source) \
                .read(source).assert_existing_objects_matched()  # write()'s counterpart
            self._model.optimizer.iterations.assign(self._survivor.step)
        else:
            # One saved without a sample count restores all but it (samples.SampleCount.begin).
            checkpointed(self._model, self._samples, source) \
                .restore(source).assert_existing_objects_matched()
        self.last_saved_step = step_of(self._model)
        log.info("restored %s (%s)", source, self.origin(source))
        return self.last_saved_step

    def save(self) -> int:
        """Saves on every worker (call it on all of them at the same step); returns the step.
        Raises Superseded instead when a newer generation claimed the directory (fence.py)."""
        step = step_of(self._model)
        newer = fence.check(self._directory, self._fence, reclaim=self._config.is_chief)
        stop_if_superseded(self._model.distribute_strategy, self._config, newer, step)
        if self._config.is_chief and not self._identity_written:
            write_identity(self._directory, JobIdentity.of(self._config))
            self._identity_written = True
        if self._samples is not None:
            self._samples.mark(step)
        path = self._manager.save(checkpoint_number=step)
        if self._config.is_chief:
            log.info("checkpoint saved: %s", path)
            survivors.prune(self._directory, step)
        else:
            shutil.rmtree(self._write_dir, ignore_errors=True)
        self.last_saved_step = step
        return step


def step_in_name(path: str | None) -> int:
    """The step a checkpoint was saved at, from its name (`<dir>/ckpt-<step>`); 0 for none."""
    if path is None:
        return 0
    _, _, number = os.path.basename(path).rpartition("-")
    return int(number) if number.isdigit() else 0


def step_of(model: keras.Model) -> int:
    """Training steps applied so far, across restarts (restored with the optimizer)."""
    return int(model.optimizer.iterations.numpy())


def save_model(context: WorkerContext, model: keras.Model, path: str) -> None:
    """Saves the trained model; call on every worker: the chief writes `path`, others a temp dir.
    Fenced like a checkpoint: a replaced group that still finishes (a pod its node never heard
    was deleted) raises Superseded instead of overwriting what its successor saves there."""
    config = context.config
    if config.checkpoint_dir is not None:
        newer = fence.check(config.checkpoint_dir, fence.own_fence(config), reclaim=False)
        with context.watchdog.armed():
            stop_if_superseded(model.distribute_strategy, config, newer, step_of(model))
    if config.is_chief:
        parent = os.path.dirname(path)
        if parent:
            tf.io.gfile.makedirs(parent)
        model.save(path)
        log.info("model saved: %s", path)
        return
    scratch = _temp_dir(config, "model")
    try:
        model.save(os.path.join(scratch, os.path.basename(path)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _temp_dir(config: RuntimeConfig, what: str) -> str:
    return tempfile.mkdtemp(prefix=f"mwj-worker{config.worker_index}-{what}-")
