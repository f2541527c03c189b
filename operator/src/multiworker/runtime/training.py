# mypy: disable-error-code="import-untyped"
"""`fit`: Keras training for one worker of the group, resumable and with contract exit codes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from multiworker.api.contract import SURVIVOR_SAVED
from multiworker.runtime import survivors
from multiworker.runtime.aborts import describe_abort
from multiworker.runtime.agreement import check_same_directory_and_step, enter_directory
from multiworker.runtime.callbacks import (
    CheckpointCallback,
    PreemptionCallback,
    ProgressCallback,
    WatchdogCallback,
    WitnessCallback,
)
from multiworker.runtime.checkpoint import CheckpointStore
from multiworker.runtime.collective import fixed_instance_keys
from multiworker.runtime.config import MWJ_CHECKPOINT_DIR, RuntimeConfig
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.elastic import SCALE_LEARNING_RATE, sized
from multiworker.runtime.errors import CollectiveAborted, ConfigError
from multiworker.runtime.exits import write_termination_message
from multiworker.runtime.inputs import distribute, distribute_examples
from multiworker.runtime.progress import Phase
from multiworker.runtime.resume import plan_segments
from multiworker.runtime.samples import SampleCount

log = logging.getLogger(__name__)

# What a collective raises when a peer died, stopped, or was reported unhealthy.
PEER_FAILURES = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)


def fit(
    context: WorkerContext,
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    epochs: int,
    steps_per_epoch: int,
    checkpoint_every_steps: int | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    global_batch: int | None = None,
) -> None:
    """Trains `model` (built and compiled under the strategy's scope) to `epochs` epochs.

    Resumes at the exact step saved from this job's own checkpoint in MWJ_CHECKPOINT_DIR, or on
    purpose from MWJ_RESUME_FROM_DIR (another job's checkpoint otherwise exits 2, see
    ownership.py); checkpoints every `checkpoint_every_steps` steps (None: each epoch), reports
    progress, and on SIGTERM checkpoints and raises Preempted (exit 143). A collective failure
    raises CollectiveAborted (exit 4), and so does a collective that waits longer than
    MWJ_COLLECTIVE_TIMEOUT_SECONDS (watchdog.py). The train step is traced with fixed collective
    keys, so a long run's memory does not grow with its steps (collective.py). A checkpoint
    directory that not every worker sees exits 2 at start; a newer generation's claim on it
    raises Superseded (exit 5) at start or before a save (agreement.py). `dataset` must yield
    one global batch per step, indefinitely (e.g. `.repeat()`); one iterator over it serves the
    whole run (inputs.py), and a resumed run starts it at the batch the restored step left off
    (deterministic pipelines then train exactly as an uninterrupted run would). When a peer
    dies, this worker saves its replica before exiting 4 (survivors.py).

    With `global_batch` (the full group's; a job with spec.elastic), `dataset` yields single
    examples instead, indefinitely and in a deterministic order: the runtime batches them at
    this generation's global batch and, under ScaleLearningRate, scales the optimizer's
    learning rate as compiled (elastic.sized), and reads on from the sample the restored
    checkpoint saved (samples.py).
    """
    if not isinstance(model, keras.Model):
        raise ConfigError([
            f"runtime.fit trains Keras 3 models; this one is a {type(model).__module__}."
            f"{type(model).__name__} (TF_USE_LEGACY_KERAS=1 makes tf.keras Keras 2): build it "
            "with `import keras`, or train it with its own model.fit (docs/keras.md)"])
    witness = survivors.Witness(model)
    samples = SampleCount() if global_batch else None
    context.stop.last_gasp = lambda signalled: _last_gasp(context, model, witness, signalled,
                                                          samples)
    context.stop.saving = witness.lock.locked
    first = [WatchdogCallback(context.watchdog), WitnessCallback(witness)]
    try:
        with context.watchdog.armed(), fixed_instance_keys():
            _fit(context, model, dataset, epochs, steps_per_epoch, checkpoint_every_steps,
                 [*first, *callbacks], global_batch, samples)
    except PEER_FAILURES as e:
        log.warning("collective error from TensorFlow:\n%s", e.message)
        message = describe_abort(type(e).__name__, e.message, context.config)
        saved = _save_survivor(context, model, witness, samples)
        if saved is not None:
            message += f"; {SURVIVOR_SAVED} {saved.step}"
        raise CollectiveAborted(message) from e


def _last_gasp(context: WorkerContext, model: keras.Model, witness: survivors.Witness,
               signalled: float, samples: SampleCount | None) -> bool | None:
    """After a SIGTERM at `signalled` (or an in-place restart: -inf) while training is stuck
    in a collective whose peer is gone: save this replica now (from another thread: the main
    one waits in the collective) and let the caller exit (True). None once a step completed
    since (training moves: it stops at an agreed step); False while it cannot tell yet."""
    if witness.stepped_since(signalled):
        return None
    if not witness.stuck():
        return False
    saved = _save_survivor(context, model, witness, samples)
    message = "SIGTERM while training was stuck in a collective (a peer gone)"
    write_termination_message(message + (f"; {SURVIVOR_SAVED} {saved.step}" if saved else ""))
    return True


def _save_survivor(context: WorkerContext, model: keras.Model, witness: survivors.Witness,
                   samples: SampleCount | None) -> survivors.SurvivorSave | None:
    """The survivor's save (survivors.py); a failure to save is logged, never raised over the
    abort that caused it."""
    try:
        saved = survivors.save(model, context.config, witness, samples)
    except Exception:  # the abort is what the operator must hear about
        log.exception("could not save this survivor's state")
        return None
    if saved is not None:
        context.progress.survivor_saved(saved.step, saved.seconds, saved.bytes_written)
    return saved


def _fit(
    context: WorkerContext,
    model: keras.Model,
    dataset: tf.data.Dataset,
    epochs: int,
    steps_per_epoch: int,
    checkpoint_every_steps: int | None,
    callbacks: Sequence[keras.callbacks.Callback],
    global_batch: int | None,
    samples: SampleCount | None,
) -> None:
    config = context.config
    strategy = model.distribute_strategy
    # Read before restore() sets the saved one.
    scaled = bool(global_batch) and config.elastic_batch == SCALE_LEARNING_RATE
    compiled_rate = _learning_rate(model) if scaled else 0.0
    # Before the store reads the directory: claim it for this generation (the fence) and look
    # for every worker's marker (agreement.py).
    directory = config.checkpoint_dir
    view = enter_directory(strategy, config, directory) if directory else None
    context.watchdog.beat()
    store = _store(model, config, samples)
    # Agree on the directory and the step before any collective that may differ between
    # workers: restoring builds the optimizer's slots under the strategy, which may run
    # collectives (broadcasts) on a worker that found a checkpoint and not on one that found
    # none; run before the check, the two could meet in different collectives (the abort
    # "expected type 1 and data_type 1 but got type 0 and data_type 9" seen on kind) instead of
    # the check naming the unshared volume.
    candidates: list[tuple[str | None, int]] = store.candidates() if store else [(None, 0)]
    check_same_directory_and_step(strategy, config, candidates[0][1], view)
    context.watchdog.beat()
    restored, source = store.restore_readable(candidates) if store else (0, None)
    context.watchdog.beat()
    segments = plan_segments(restored, steps_per_epoch, epochs)
    if restored:
        epoch, batch = divmod(restored, steps_per_epoch)
        context.progress.restored(restored, epoch, store.origin(source) if store else "")
        if segments:
            log.info("resuming from step %d (epoch %d, batch %d)", restored, epoch + 1, batch)
        else:
            log.info("step %d restored: all %d epochs are already trained", restored, epochs)
    all_callbacks = [
        ProgressCallback(context.progress, epochs),
        *([CheckpointCallback(store, context.progress, checkpoint_every_steps)] if store else []),
        PreemptionCallback(strategy, context.stop, store, context.progress, config.num_workers),
        *callbacks,
    ]
    context.progress.set_phase(Phase.TRAINING)
    if global_batch and samples is not None:
        data, spec = _sized_input(context, model, dataset, global_batch, compiled_rate,
                                  samples, restored)
    else:
        # One iterator for all segments, starting at the batch the restored step left off.
        data, spec = distribute(strategy, dataset, skip=restored), dataset.element_spec
    _build_from_spec(model, spec)
    with _metrics_without_eager_collectives(model):
        for segment in segments:
            model.fit(
                data,
                initial_epoch=segment.initial_epoch,
                epochs=segment.epochs,
                steps_per_epoch=segment.steps_per_epoch,
                callbacks=all_callbacks,
                shuffle=False,  # a tf.data pipeline shuffles itself
                verbose=0,
            )
    if samples is not None:
        step = int(model.optimizer.iterations.numpy())
        log.info("trained to step %d on samples [0, %d)", step, samples.at(step))


def _sized_input(context: WorkerContext, model: keras.Model, examples: tf.data.Dataset,
                 full_batch: int, compiled_rate: float, samples: SampleCount, restored: int
                 ) -> tuple[Any, Any]:
    """The input of this generation's size, from the sample the restored step left off, and
    its element spec; the learning rate the size calls for (restore() brought back the saved
    one)."""
    size = sized(context.config, full_batch, compiled_rate)
    start = samples.begin(restored, size.global_batch, full_batch)
    if context.config.elastic_batch == SCALE_LEARNING_RATE:
        model.optimizer.learning_rate.assign(size.learning_rate)
    log.info("%d of %d workers: global batch %d, learning rate %.6g, from sample %d (step %d)",
             size.workers, size.max_workers, size.global_batch,
             float(model.optimizer.learning_rate.numpy()), start, restored)
    return (distribute_examples(model.distribute_strategy, examples, start, size.global_batch),
            examples.batch(size.global_batch).element_spec)


def _learning_rate(model: keras.Model) -> float:
    """The learning rate the script compiled, a constant one (ScaleLearningRate scales it)."""
    rate = model.optimizer._learning_rate
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ConfigError(["spec.elastic.batch ScaleLearningRate needs a constant learning "
                           "rate; with a schedule, scale it in the script "
                           "(runtime.elastic.sized) or choose KeepGlobal"])
    return float(rate.numpy())


def _build_from_spec(model: keras.Model, element_spec: Any) -> None:
    """Builds the model from the input's element spec, once, and switches off the build
    Keras's TF trainer does at the start of every `fit` call. That build takes one batch from
    the input and averages it across the replicas: from the one persistent iterator
    (inputs.py) the batch would never be trained, and the average is a collective of the
    batch's shape, which fails when a global batch does not split evenly (43/43/42: an elastic
    group under KeepGlobal). Keras needs only shapes and dtypes here, which a spec has."""
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=element_spec)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


@contextlib.contextmanager
def _metrics_without_eager_collectives(model: keras.Model) -> Iterator[None]:
    """At each epoch's start and end Keras resets and reads its metrics eagerly; under MWMS
    each metric variable is then summed over the workers by an eager collective, which takes
    a new instance key, and TensorFlow keeps a record per key (collective.py): ~10 records an
    epoch, unbounded over a long run of short epochs. Inside `fit` the resets run traced
    (with fixed keys), and the epoch's logs are its last step's, which the train step has
    already averaged over the workers (Keras's own choice when they name other metrics than
    the model's, as with a custom train step)."""
    eager = {name: getattr(model, name)
             for name in ("_get_metrics_result_or_logs", "reset_metrics")}
    model.reset_metrics = tf.function(eager["reset_metrics"])
    model._get_metrics_result_or_logs = lambda logs: logs
    try:
        yield
    finally:
        for name, method in eager.items():
            setattr(model, name, method)


def _store(model: keras.Model, config: RuntimeConfig, samples: SampleCount | None
           ) -> CheckpointStore | None:
    if config.checkpoint_dir is None:
        log.warning("%s is not set: no checkpoints, a restart starts over", MWJ_CHECKPOINT_DIR)
        return None
    return CheckpointStore(model, config, config.checkpoint_dir, samples)

