# mypy: allow-subclassing-any
"""Example MultiWorkerJob training: learn y = x.W + b from noisy synthetic data (no downloads).

The data has a known solution, so the script can check that training really worked: at the end
it measures the mean squared error on fresh data and exits 1 unless it is below the target
(the noise floor is NOISE**2 = 0.01).

Runs as one worker of a group (TF_CONFIG and MWJ_* from the operator) or standalone for a
smoke test: `MWJ_PROGRESS_PORT=0 python examples/training/train.py --epochs 2`.

Every option also reads an environment variable, so a MultiWorkerJob can set it without
changing the command; flags win. `--step-sleep` slows training so tests can interrupt it;
`--fail-at-epoch` simulates a crash (exit `--exit-code` when that epoch starts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from multiworker import runtime

log = logging.getLogger("train")

FEATURES = 8
NOISE = 0.1
DATA_SEED, EVAL_SEED = 7, 8
EXAMPLES = 4096


def main(ctx: runtime.WorkerContext, args: argparse.Namespace) -> None:
    if args.seed is not None:  # the same run twice gives the same weights (the oracle test)
        keras.utils.set_random_seed(args.seed)
        tf.config.experimental.enable_op_determinism()
    runtime.wait_for_peers(ctx)
    strategy = runtime.make_strategy(ctx)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(args.learning_rate), loss="mse")
    # The full group's global batch: a smaller one (spec.elastic) trains with its share of it
    # or, under ScaleLearningRate, with its own workers' batches; the runtime batches.
    full_size = ctx.config.max_workers or ctx.config.num_workers
    runtime.fit(
        ctx,
        model,
        training_examples(),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        checkpoint_every_steps=args.checkpoint_every or None,
        callbacks=[TestHooks(ctx, args)],
        global_batch=args.batch_size * full_size,
    )
    if args.model_path:
        runtime.save_model(ctx, model, args.model_path)
    log.info("weights digest %s", weights_digest(model))
    check_target(model, args.target_loss)


def weights_digest(model: keras.Model) -> str:
    """The trained weights, bit for bit, in a few characters."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.asarray(weight.numpy()).tobytes())
    return digest.hexdigest()[:16]


def true_solution() -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(0)
    return rng.uniform(-2, 2, size=(FEATURES, 1)).astype("float32"), 0.5


def examples(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    weights, bias = true_solution()
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, FEATURES)).astype("float32")
    y = x @ weights + bias + rng.normal(scale=NOISE, size=(count, 1)).astype("float32")
    return x, y


def training_examples() -> tf.data.Dataset:
    """The same examples on every worker, one at a time, in the same order every run;
    `runtime.fit` batches them and MWMS shards each batch across the workers."""
    options = tf.data.Options()
    policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )  # in-memory data: no files to shard
    options.experimental_distribute.auto_shard_policy = policy
    dataset = tf.data.Dataset.from_tensor_slices(examples(DATA_SEED, EXAMPLES))
    return dataset.shuffle(EXAMPLES, seed=1).repeat().with_options(options)


def check_target(model: keras.Model, target: float) -> None:
    """Evaluates locally (no collectives), so every worker checks the same replicated weights."""
    x, y = examples(EVAL_SEED, 1024)
    mse = float(np.mean((model(x, training=False).numpy() - y) ** 2))
    weights, _ = true_solution()
    error = float(np.max(np.abs(model.layers[0].kernel.numpy() - weights)))
    log.info("eval mse %.4f (target %.4f), max weight error %.3f", mse, target, error)
    if not mse <= target:
        raise SystemExit(f"target not reached: eval mse {mse:.4f} > {target:.4f}")
    log.info("target reached")


class TestHooks(keras.callbacks.Callback):
    """The knobs tests use: a per-step sleep and a simulated crash."""

    def __init__(self, ctx: runtime.WorkerContext, args: argparse.Namespace) -> None:
        super().__init__()
        self._sleep = args.step_sleep
        config = ctx.config
        self._crash = (
            args.fail_at_epoch > 0
            and args.fail_worker in (-1, config.worker_index)
            and args.fail_generation in (-1, config.restart_count)
        )
        self._fail_at_epoch = args.fail_at_epoch
        self._exit_code = args.exit_code
        # --kill: SIGKILL this worker at a step of this generation, `begin` (before its
        # collective: the peers wait in the all-reduce) or `end` (after the step's callbacks,
        # a checkpoint included); `step` absolute, or `after` steps into the generation.
        self._kills = [k for k in json.loads(args.kill or "[]")
                       if k["generation"] == config.restart_count
                       and k["worker"] == config.worker_index]
        self._first: int | None = None

    def _kill_if(self, when: str, step: int) -> None:
        if self._first is None:  # the generation's first step (its begin comes first)
            self._first = step
        for kill in self._kills:
            target = kill["step"] if "step" in kill else self._first - 1 + kill["after"]
            if kill["at"] == when and step == target:
                log.warning("test: SIGKILL at the %s of step %d", when, step)
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._crash and epoch + 1 == self._fail_at_epoch:
            log.error(
                "simulated crash at the start of epoch %d: exit %d",
                epoch + 1,
                self._exit_code,
            )
            logging.shutdown()
            os._exit(self._exit_code)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._kills:
            self._kill_if("begin", int(self.model.optimizer.iterations.numpy()) + 1)

    def on_train_batch_end(
        self, batch: int, logs: dict[str, Any] | None = None
    ) -> None:
        if self._kills:
            self._kill_if("end", int(self.model.optimizer.iterations.numpy()))
        if self._sleep:
            time.sleep(self._sleep)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    option = parser.add_argument
    option("--epochs", type=int, default=int(env("TRAIN_EPOCHS", "5")))
    option(
        "--steps-per-epoch", type=int, default=int(env("TRAIN_STEPS_PER_EPOCH", "40"))
    )
    option(
        "--batch-size",
        type=int,
        default=int(env("TRAIN_BATCH_SIZE", "32")),
        help="per worker; the global batch is this times the number of workers",
    )
    option(
        "--learning-rate", type=float, default=float(env("TRAIN_LEARNING_RATE", "0.05"))
    )
    option(
        "--checkpoint-every",
        type=int,
        default=int(env("TRAIN_CHECKPOINT_EVERY", "0")),
        help="steps between checkpoints; 0 checkpoints at each epoch end",
    )
    option("--target-loss", type=float, default=float(env("TRAIN_TARGET_LOSS", "0.02")))
    option(
        "--model-path",
        default=env("TRAIN_MODEL_PATH", ""),
        help="where the chief saves the final model (.keras); empty: not saved",
    )
    option(
        "--step-sleep",
        type=float,
        default=float(env("TRAIN_STEP_SLEEP", "0")),
        help="seconds to sleep after each step, so tests can interrupt training",
    )
    option(
        "--fail-at-epoch",
        type=int,
        default=int(env("TRAIN_FAIL_AT_EPOCH", "0")),
        help="simulate a crash when this (1-based) epoch starts; 0: never",
    )
    option(
        "--exit-code",
        type=int,
        default=int(env("TRAIN_FAIL_EXIT_CODE", "1")),
        help="exit code of the simulated crash",
    )
    option(
        "--fail-worker",
        type=int,
        default=int(env("TRAIN_FAIL_WORKER", "-1")),
        help="which worker crashes; -1: all",
    )
    option(
        "--fail-generation",
        type=int,
        default=int(env("TRAIN_FAIL_GENERATION", "0")),
        help="crash only in this group generation (MWJ_RESTART_COUNT); -1: every one",
    )
    option(
        "--seed",
        type=int,
        default=int(env("TRAIN_SEED")) if env("TRAIN_SEED") else None,
        help="seed every random choice and make TensorFlow's ops deterministic",
    )
    option(
        "--kill",
        default=env("TRAIN_KILL", ""),
        help='tests: JSON list of {"generation", "worker", "at": "begin"|"end", "step" or '
        '"after"}: SIGKILL this worker there',
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    runtime.run(lambda ctx: main(ctx, arguments))
