# mypy: allow-subclassing-any
"""Example MultiWorkerJob training: classify handwritten digits (8x8 images, 10 classes).

The data is the UCI handwritten digits (1,797 images, data/digits.csv.gz beside this script:
no download; data/README.md says where it comes from). A fixed, stratified fifth of it is held
out; at the end every worker measures the accuracy on it and the script exits 1 unless it
reaches the target (0.9 by default; 3 CPU workers reach about 0.96 in 20 epochs, see the
README).

Runs as one worker of a group (TF_CONFIG and MWJ_* from the operator) or standalone:
`MWJ_PROGRESS_PORT=0 python examples/training/digits.py --epochs 5`. Every option also reads
an environment variable (TRAIN_EPOCHS, ...), so a MultiWorkerJob can set it without changing
the command; flags win.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from multiworker import runtime

log = logging.getLogger("digits")

CLASSES = 10
HELD_OUT = 0.2
DATA = Path(__file__).resolve().parent / "data" / "digits.csv.gz"  # 64 pixels, then the label
SPLIT_SEED, SHUFFLE_SEED = 0, 1


def main(ctx: runtime.WorkerContext, args: argparse.Namespace) -> None:
    (x_train, y_train), (x_test, y_test) = digits()
    runtime.wait_for_peers(ctx)
    strategy = runtime.make_strategy(ctx)
    with strategy.scope():
        model = build_model(args.learning_rate)
    # The full group's global batch: a smaller one (spec.elastic) trains with its share of it
    # or, under ScaleLearningRate, with its own workers' batches; the runtime batches.
    global_batch = args.batch_size * (ctx.config.max_workers or ctx.config.num_workers)
    runtime.fit(
        ctx,
        model,
        training_examples(x_train, y_train),
        epochs=args.epochs,
        steps_per_epoch=math.ceil(len(x_train) / global_batch),  # about one pass per epoch
        checkpoint_every_steps=args.checkpoint_every or None,
        global_batch=global_batch,
    )
    if args.model_path:
        runtime.save_model(ctx, model, args.model_path)
    check_accuracy(model, x_test, y_test, args.target_accuracy)


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, held-out) pixels scaled to [0, 1] and labels; the same split on every worker."""
    table = np.loadtxt(DATA, delimiter=",", dtype="int64")
    x = (table[:, :-1] / 16.0).astype("float32")  # pixel values are 0..16
    y = table[:, -1]
    held_out = stratified_held_out(y, HELD_OUT, np.random.default_rng(SPLIT_SEED))
    return (x[~held_out], y[~held_out]), (x[held_out], y[held_out])


def stratified_held_out(labels: np.ndarray, fraction: float,
                        rng: np.random.Generator) -> np.ndarray:
    """A mask holding out ceil(fraction * n) examples, each class in proportion (the largest
    remainders get the rounding), chosen at random within each class."""
    classes, counts = np.unique(labels, return_counts=True)
    wanted = counts * fraction
    take = np.floor(wanted).astype(int)
    short = math.ceil(len(labels) * fraction) - int(take.sum())
    take[np.argsort(take - wanted, kind="stable")[:short]] += 1
    mask = np.zeros(len(labels), dtype=bool)
    for label, n in zip(classes, take):
        mask[rng.permutation(np.flatnonzero(labels == label))[:n]] = True
    return mask


def build_model(learning_rate: float) -> keras.Model:
    """A small multilayer perceptron: 64 pixels -> 64 hidden units -> 10 class scores."""
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],  # reported as `accuracy` in /progress and status.progress
    )
    return model


def training_examples(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    """The same examples on every worker, one at a time, in the same order every run;
    `runtime.fit` batches them and MWMS splits each global batch across the workers."""
    options = tf.data.Options()
    # In-memory data has no files to shard by: shard the batches.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.shuffle(len(x), seed=SHUFFLE_SEED).repeat().with_options(options)


def check_accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray, target: float) -> None:
    """Held-out accuracy, computed locally (no collectives) from the replicated weights."""
    predicted = np.argmax(model(x, training=False).numpy(), axis=1)
    accuracy = float(np.mean(predicted == y))
    log.info("held-out accuracy %.4f on %d images (target %.2f)", accuracy, len(y), target)
    if not accuracy >= target:
        raise SystemExit(f"target not reached: held-out accuracy {accuracy:.4f} < {target:.2f}")
    log.info("target reached")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    option = parser.add_argument
    option("--epochs", type=int, default=int(env("TRAIN_EPOCHS", "20")))
    option(
        "--batch-size",
        type=int,
        default=int(env("TRAIN_BATCH_SIZE", "32")),
        help="per worker; the global batch is this times the number of workers",
    )
    option("--learning-rate", type=float, default=float(env("TRAIN_LEARNING_RATE", "0.01")))
    option(
        "--checkpoint-every",
        type=int,
        default=int(env("TRAIN_CHECKPOINT_EVERY", "0")),
        help="steps between checkpoints; 0 checkpoints at each epoch end",
    )
    option(
        "--target-accuracy",
        type=float,
        default=float(env("TRAIN_TARGET_ACCURACY", "0.9")),
        help="exit 1 unless the held-out accuracy reaches this",
    )
    option(
        "--model-path",
        default=env("TRAIN_MODEL_PATH", ""),
        help="where the chief saves the trained model (.keras); empty: not saved",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    runtime.run(lambda ctx: main(ctx, arguments))
