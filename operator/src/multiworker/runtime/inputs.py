# mypy: disable-error-code="import-untyped"
# mypy: allow-subclassing-any
"""The distributed input `fit` hands to Keras: one iterator for the whole run, never destroyed.

Why (measured with TF 2.21, 3 CPU workers): each `model.fit` call makes a new distributed
iterator and drops it when it returns. Dropping it runs TensorFlow's iterator destructor, which
waits for the tf.data autotuning thread of the per-device pipeline (`Model::OptimizeLoop`) to
exit; in many runs the cancellation does not wake that thread and it sleeps out its
optimization period, which doubles up to 60 s. The destructor holds the GIL meanwhile, so the
whole worker freezes (/progress stops answering too) after its last step and before its final
save: 0-51 s measured, and exactly the remaining period TF logs (`Waiting for N ms`,
TF_CPP_VMODULE=model=2). A run therefore iterates one iterator across all its `model.fit`
calls, and that iterator is never destroyed: the process's exit frees it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import input_lib


class PersistentDistributedDataset(input_lib.DistributedDataset):
    """`strategy.experimental_distribute_dataset(dataset)` whose every iteration continues the
    same iterator, so Keras's `fit` never drops one (the dataset must repeat indefinitely).

    A view of an already distributed dataset (same attributes), hence no `super().__init__`;
    Keras accepts it as the `tf.distribute.DistributedDataset` it is.
    """

    def __init__(self, distributed: input_lib.DistributedDataset, skip: int = 0) -> None:
        self.__dict__.update(distributed.__dict__)
        self._persistent: Any = None
        if skip:
            # Each worker's own stream, as sharded and rebatched for it: one element per step.
            # Skipping the user's dataset instead would skip minibatches, not steps, where
            # TensorFlow rebatches at the batch op (its legacy rebatch).
            clones: list[Any] = self._cloned_datasets  # type: ignore[has-type]
            self._cloned_datasets = [d.skip(skip) for d in clones]

    def __iter__(self) -> Any:
        if self._persistent is None:
            self._persistent = super().__iter__()
            _never_destroy(self._persistent)
        return self._persistent


def distribute(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, skip: int = 0
               ) -> Any:
    """The dataset as Keras should get it under `strategy` (see the module docstring), its
    first `skip` steps passed over (a resumed run continues where the restored step left
    off; tf.data reads them, so a deterministic pipeline gives the batches an uninterrupted
    run would have used next)."""
    return PersistentDistributedDataset(strategy.experimental_distribute_dataset(dataset), skip)


def _never_destroy(obj: object) -> None:
    """Leaks one reference, so not even interpreter shutdown runs the blocking destructor;
    the memory goes back to the OS with the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def distribute_examples(strategy: tf.distribute.Strategy, examples: tf.data.Dataset,
                        start: int, global_batch: int) -> Any:
    """A dataset of single examples as Keras should get it in global batches of
    `global_batch`, from example `start` on: the input of a group whose global batch may differ
    from the last generation's (spec.elastic; samples.py counts where it stands)."""
    return distribute(strategy, examples.skip(start).batch(global_batch))
