# mypy: disable-error-code="import-untyped"
"""Tiny host-side all-reduces the runtime uses to keep workers in agreement."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

_RING = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING
)


def sum_over_workers(strategy: tf.distribute.Strategy, values: Sequence[int]) -> list[int]:
    """Element-wise sums of `values` over all workers; every worker must call it at the same
    point. RING because these are host integers (NCCL is for GPU tensors)."""
    tensor = tf.constant(values, dtype=tf.int64)
    total = strategy.extended.reduce_to(
        tf.distribute.ReduceOp.SUM, tensor, destinations=tensor, options=_RING
    )
    return [int(v) for v in total.numpy()]
