# mypy: disable-error-code="import-untyped"
"""A worker of about `--params` parameters trained with Adam, for bench_survivor_size.py.

The runtime's `fit` on a stack of square Dense layers over a fixed synthetic batch (the
model's size is what counts, not what it learns), with timers on what the bench measures:
each step's time, the survivors' witness inside it (survivors.Witness.step_done), the
restore (checkpoint.CheckpointStore.restore_readable) and, with `--broadcast`, one all-reduce
of the whole state over the new group (what restoring by one read and a broadcast would add to
that read). The figures go to `--figures` (JSON, rewritten after every step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from multiworker import runtime
from multiworker.runtime import checkpoint, survivors

WIDTH = 1024  # 1.05 M parameters a layer
BATCH = 2  # per worker


class Figures:
    def __init__(self, path: str) -> None:
        self.path = path
        self.values: dict[str, Any] = {"steps": [], "witness": []}

    def set(self, **values: Any) -> None:
        self.values.update(values)
        self.write()

    def write(self) -> None:
        temp = f"{self.path}.tmp"
        with open(temp, "w") as file:
            json.dump(self.values, file)
        os.replace(temp, self.path)


def timed_witness(figures: Figures) -> None:
    step_done = survivors.Witness.step_done

    def timed(self: survivors.Witness, step: int) -> None:
        started = time.perf_counter()
        step_done(self, step)
        figures.values["witness"].append(time.perf_counter() - started)

    survivors.Witness.step_done = timed  # type: ignore[method-assign]


def timed_restore(figures: Figures) -> None:
    restore = checkpoint.CheckpointStore.restore_readable

    def timed(self: checkpoint.CheckpointStore, candidates: Any) -> Any:
        started = time.perf_counter()
        found = restore(self, candidates)
        figures.set(restore=time.perf_counter() - started, restored=found[0])
        return found

    checkpoint.CheckpointStore.restore_readable = timed  # type: ignore[method-assign]


class StepTimer(keras.callbacks.Callback):
    def __init__(self, figures: Figures) -> None:
        super().__init__()
        self._figures = figures
        self._began = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # The callbacks before this one (the witness first) are inside the step's time.
        steps = self._figures.values["steps"]
        steps.append(time.perf_counter() - self._began)
        witness = self._figures.values["witness"][1:]  # the first holds the sample's tracing
        self._figures.set(step=int(self.model.optimizer.iterations.numpy()),
                          step_median=statistics.median(steps[1:] or steps),
                          witness_median=statistics.median(witness) if witness else 0.0)


def broadcast_seconds(strategy: tf.distribute.Strategy, model: keras.Model) -> float:
    """One all-reduce of every variable of the state (the chief's values, zeros elsewhere):
    what a broadcast of a restore read once would cost over the new collective."""
    state = [getattr(v, "value", v) for v in [*model.variables, *model.optimizer.variables]]
    values = [tf.identity(v) for v in state if v.dtype.is_floating]

    @tf.function
    def reduce() -> Any:
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)

    started = time.perf_counter()
    strategy.run(reduce)
    return time.perf_counter() - started


def main(ctx: runtime.WorkerContext, args: argparse.Namespace) -> None:
    figures = Figures(args.figures)
    timed_witness(figures)
    timed_restore(figures)
    runtime.wait_for_peers(ctx)
    strategy = runtime.make_strategy(ctx)
    layers = max(1, round(args.params / (WIDTH * WIDTH + WIDTH)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,)),
                                  *(keras.layers.Dense(WIDTH) for _ in range(layers))])
        model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
    figures.set(params=model.count_params())
    batch = BATCH * ctx.config.num_workers
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, WIDTH)).astype("float32")
    data = tf.data.Dataset.from_tensors((x, np.zeros_like(x))).repeat()
    if args.broadcast:
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        figures.set(broadcast=broadcast_seconds(strategy, model))
    runtime.fit(ctx, model, data, epochs=1, steps_per_epoch=1_000_000,
                checkpoint_every_steps=args.checkpoint_every, callbacks=[StepTimer(figures)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=10e6)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--figures", required=True)
    parser.add_argument("--broadcast", action="store_true")
    arguments = parser.parse_args()
    runtime.run(lambda ctx: main(ctx, arguments))
