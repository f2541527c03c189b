# mypy: disable-error-code="import-untyped"
"""Checkpoints for resuming a group, and the final model, written the MWMS way.

Every worker must take part in a save (TF requires it: saving distributed variables may run
collectives), but only the chief (worker 0) writes to the real path; the others write to a
local temp dir that is deleted right away (the `_is_chief` / write_filepath pattern of TF's
multi-worker Keras tutorial). All workers restore from the chief's MWJ_CHECKPOINT_DIR, so it
must be storage every worker can read; `fit` checks that they all see it and found the same
step; a newest checkpoint that cannot be read (cut short by a crash) is passed over by all of
them together. The chief records the job's identity beside its checkpoints (ownership.py), so
that no job restores another's state by accident, and no save starts once a newer generation
of the job claimed the directory (fence.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time

import keras
import tensorflow as tf

from multiworker.runtime import fence, survivors
from multiworker.runtime.agreement import stop_if_superseded
from multiworker.runtime.collective import sum_over_workers
from multiworker.runtime.config import MWJ_CHECKPOINT_DIR, RuntimeConfig
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import ConfigError
from multiworker.runtime.ownership import JobIdentity, restore_source, write_identity
from multiworker.runtime.samples import SampleCount, checkpointed

log = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2  # the previous one survives a crash in the middle of writing the latest
PROBE_BYTES = 16 * 2**20  # written (and synced) once to measure the volume before a checkpoint
ORIGIN_LENGTH = 128  # of the report's restoredFrom, as the operator reads it (status.resumedFrom)


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
        self._passed_over: list[str] = []  # newer candidates that could not be read
        self._probed: float | None = None  # bytes/s of a synced write here (the probe)
        self._saved: float | None = None  # bytes/s of the chief's last checkpoint
        self.last_saved_step = 0

    def candidates(self) -> list[tuple[str | None, int]]:
        """What restore_readable() may load, newest first, with their steps: a survivor's save
        of a higher step (survivors.py), this job's latest checkpoint — or on a deliberate
        resume the other run's (ownership.restore_source) — then the older ones kept beside
        it. [(None, 0)] when there is none. Reads files only, never the model."""
        source = restore_source(self._config, tf.train.latest_checkpoint)
        step = step_in_name(source)
        found: list[tuple[str | None, int]] = []
        if source is not None:
            found = [(source, step), *((p, step_in_name(p)) for p in _older(source))]
        survivor = survivors.newest(self._directory, self._config.job_uid)
        if survivor is not None and survivor.step > step:
            self._survivor = survivor
            found.insert(0, (survivor.path, survivor.step))
        return found or [(None, 0)]

    def origin(self, source: str | None) -> str:
        """Where `source` came from, in words: a survivor, or a checkpoint (and the newer ones
        passed over as unreadable)."""
        if self._survivor is not None and source == self._survivor.path:
            said = self._survivor.describe()
        else:
            said = "checkpoint" if source is not None else "none"
        if self._passed_over:
            said += f"; unreadable, passed over: {', '.join(self._passed_over)}"
        return said if len(said) <= ORIGIN_LENGTH else said[:ORIGIN_LENGTH - 3] + "..."

    def restore_readable(self, candidates: list[tuple[str | None, int]]) -> tuple[int, str | None]:
        """Loads the newest of `candidates` (from candidates()) that every worker can read;
        returns its step (0 if none) and path. Call it only once every worker agreed on the
        newest one's step (agreement.check_same_directory_and_step): building the optimizer's
        slots under the strategy runs collectives.

        A save cut short by a crash (its files not yet on the volume when a node died) would
        fail every restart the same way, so it is passed over, and said so — by all workers
        together, one all-reduce a candidate: they read the same files, but a replica restored
        from another step than its peers would train on silently diverging weights. Raises
        ConfigError (exit 2) when no candidate is readable: a restart cannot help."""
        if candidates[0][0] is None:
            return 0, None
        strategy = self._model.distribute_strategy
        with strategy.scope():
            # Slot variables must exist before restoring into them (Keras builds them lazily).
            self._model.optimizer.build(self._model.trainable_variables)
        errors = []
        for source, _ in candidates:
            assert source is not None
            error = self._read(source)
            unreadable = sum_over_workers(strategy, [int(error is not None)])[0]
            if not unreadable:
                self.last_saved_step = step_of(self._model)
                log.info("restored %s (%s)", source, self.origin(source))
                return self.last_saved_step, source
            why = error or f"unreadable on {unreadable} other worker(s)"
            log.warning("cannot restore %s (%s): trying the next newest", source, why)
            errors.append(f"{source}: {why}")
            self._passed_over.append(os.path.basename(source))
        raise ConfigError([
            f"{MWJ_CHECKPOINT_DIR}: no checkpoint in {self._directory} could be restored ("
            + "; ".join(errors) + "); a model changed since they were written cannot load "
            "them: move them aside to start from step 0, or restore the model they hold"])

    def _read(self, source: str) -> str | None:
        """Restores `source` into the model; None, or why it could not."""
        try:
            if self._survivor is not None and source == self._survivor.path:
                # The survivors' copy, in parts (survivors.py); its optimizer may have counted
                # the step that failed: the copy names the step its weights reflect.
                survivors.restore(self._survivor,
                                  survivors.state_variables(self._model, self._samples),
                                  self._config.job_uid)
                self._model.optimizer.iterations.assign(self._survivor.step)
            else:
                # One saved without a sample count restores all but it
                # (samples.SampleCount.begin).
                checkpointed(self._model, self._samples, source) \
                    .restore(source).assert_existing_objects_matched()
        except Exception as e:  # noqa: BLE001 - torn files fail in many ways (IndexError:
            # "Read less bytes than requested", DataLossError, a proto that does not parse,
            # the assertion of a model that does not match): each means this one is unreadable
            return f"{type(e).__name__}: {_first_line(str(e))}"
        return None

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
        started = time.monotonic()
        path = self._manager.save(checkpoint_number=step)
        if self._config.is_chief:
            self._saved = self.state_bytes() / max(time.monotonic() - started, 1e-3)
            log.info("checkpoint saved: %s", path)
            survivors.prune(self._directory, step)
        else:
            shutil.rmtree(self._write_dir, ignore_errors=True)
        self.last_saved_step = step
        return step

    def state_bytes(self) -> int:
        return survivors.state_bytes(survivors.state_variables(self._model, self._samples))

    def expected_save_seconds(self) -> float | None:
        """How long writing the state once takes on this directory: its bytes over the
        slower of the write rates measured there — a synced probe (survivors sync their parts)
        and the chief's last checkpoint. The survivors of a failure write one copy between
        them (survivors.py), so at most this long where they share the volume's bandwidth; the
        operator waits for them about twice it (decide/policy.survivor_save_grace). The
        chief's alone (None elsewhere): the operator reads the chief's report."""
        if not self._config.is_chief:
            return None
        if self._probed is None:
            self._probed = PROBE_BYTES / max(_probe(self._directory, PROBE_BYTES), 1e-3)
        rate = min(self._probed, self._saved or self._probed)
        return round(self.state_bytes() / rate, 3)


def _probe(directory: str, size: int) -> float:
    """Seconds to write and sync `size` bytes to `directory` (a file deleted afterwards)."""
    path = os.path.join(directory, f".write-probe-{os.getpid()}")
    block = os.urandom(2**20)  # incompressible, as weights are
    started = time.monotonic()
    try:
        with open(path, "wb") as file:
            for _ in range(size // len(block)):
                file.write(block)
            file.flush()
            os.fsync(file.fileno())
        return time.monotonic() - started
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def step_in_name(path: str | None) -> int:
    """The step a checkpoint was saved at, from its name (`<dir>/ckpt-<step>`); 0 for none."""
    if path is None:
        return 0
    _, _, number = os.path.basename(path).rpartition("-")
    return int(number) if number.isdigit() else 0


def _older(source: str) -> list[str]:
    """The checkpoints kept beside `source` (KEEP_CHECKPOINTS) with lower steps, newest
    first."""
    directory = os.path.dirname(source)
    state = tf.train.get_checkpoint_state(directory)
    kept = [os.path.join(directory, os.path.basename(p))
            for p in (state.all_model_checkpoint_paths if state is not None else [])]
    return sorted((p for p in kept if step_in_name(p) < step_in_name(source)),
                  key=step_in_name, reverse=True)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:300]


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
