# mypy: disable-error-code="import-untyped"
"""Collectives whose cost does not grow with the number run: fixed instance keys, and the tiny
host-side all-reduces the runtime uses to keep workers in agreement.

By default MWMS gives every *call* of a collective a new instance key (TF 2.21,
`cross_device_utils.CollectiveReplicaLauncher._prefer_unique_instance_key`), and TensorFlow's
parameter resolver keeps a record per instance key for the life of the process: measured on
loopback, 3.2 KB per training step of two collectives, linear for as long as training runs
(a trainer of the CPU example grew 607 -> 985 MiB over 29 minutes). With the preference off
while a function is traced, its collectives take their keys at trace time and every call
reuses them: the records stop growing. Keys assigned at trace time must agree between
workers, so every worker must trace the same functions in the same order; the runtime's own
functions (the train step in `fit`, the sums here) do, so the preference is off only while
they are traced (`fixed_instance_keys`) and a user's own loop keeps TensorFlow's default.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils

log = logging.getLogger(__name__)

_RING = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING
)
_LAUNCHER = cross_device_utils.CollectiveReplicaLauncher
_PREFERENCE = "_prefer_unique_instance_key"
_SUMS: weakref.WeakKeyDictionary[tf.distribute.Strategy, Callable[[tf.Tensor], tf.Tensor]] = \
    weakref.WeakKeyDictionary()


@contextlib.contextmanager
def fixed_instance_keys() -> Iterator[None]:
    """Functions traced inside take their collectives' instance keys at trace time (see the
    module docstring). Where TensorFlow no longer has the preference, says so once: training
    works as before, its memory grows again."""
    if not hasattr(_LAUNCHER, _PREFERENCE):
        log.warning("TensorFlow %s has no %s.%s: collectives keep a record per call "
                    "(memory grows with steps)", tf.__version__, _LAUNCHER.__name__,
                    _PREFERENCE)
        yield
        return
    before = getattr(_LAUNCHER, _PREFERENCE)
    setattr(_LAUNCHER, _PREFERENCE, False)
    try:
        yield
    finally:
        setattr(_LAUNCHER, _PREFERENCE, before)


def sum_over_workers(strategy: tf.distribute.Strategy, values: Sequence[int]) -> list[int]:
    """Element-wise sums of `values` over all workers; every worker must call it at the same
    point. RING because these are host integers (NCCL is for GPU tensors). One traced
    function per strategy and length, its keys fixed: a call costs no new record. Every
    local replica (one per GPU) adds the worker's values, so the sum is divided by their
    number, which MWMS requires to be the same on every worker."""
    summed = _SUMS.get(strategy)
    if summed is None:
        summed = _SUMS[strategy] = tf.function(_summing(strategy))
    with fixed_instance_keys():
        total = summed(tf.constant(values, dtype=tf.int64))
    return [int(v) for v in total.numpy()]


def _summing(strategy: tf.distribute.Strategy) -> Callable[[tf.Tensor], tf.Tensor]:
    def sum_over(values: tf.Tensor) -> Any:
        def replica() -> Any:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(values),
                                      options=_RING)

        local = strategy.experimental_local_results(strategy.run(replica))
        return local[0] // len(local)

    return sum_over
