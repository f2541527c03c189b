"""The end of a run costs what the final save costs: no tf.data iterator is destroyed when
`model.fit` returns (inputs.py says why that froze workers for up to a minute).

Asserted by mechanism, not by time: a run makes one distributed input iterator for all its
`model.fit` calls and never destroys it, as TensorFlow's own log of its multi-device iterators
(created and destroyed with the iterator that stalls) shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf
from multiworker.runtime.inputs import PersistentDistributedDataset, distribute

from tests.runtime.workers import Launcher

pytestmark = pytest.mark.timeout(240)

TF_ITERATOR_LOG = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "multi_device_iterator_ops=2"}
CREATED, DESTROYED = "Creating multi-device iterator.", "Destroying multi-device iterator."
QUICK = ("--target-loss", "1000")  # the synthetic target is beside the point here


def test_every_iteration_continues_one_iterator() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # standalone: one local worker
    data = distribute(strategy, tf.data.Dataset.range(100).repeat().batch(4))
    assert isinstance(data, PersistentDistributedDataset)
    assert isinstance(data, tf.distribute.DistributedDataset)  # what Keras accepts as is
    first = iter(data)
    assert iter(data) is first
    batches = [int(strategy.experimental_local_results(next(iter(data)))[0][0]) for _ in range(3)]
    assert batches == [0, 4, 8]  # continued, not restarted
    assert data.element_spec.shape.as_list() == [None]


def test_a_resumed_run_never_destroys_its_input_iterator(
    launcher: Launcher, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    first = launcher.start(2, checkpoint_dir=checkpoints,
                           args=("--epochs", "1", "--steps-per-epoch", "15", *QUICK))
    assert [w.wait(timeout=150) for w in first] == [0, 0], launcher.logs()

    # Step 15 of 10-step epochs: the rest of epoch 2, then epoch 3 -- two `model.fit` calls.
    second = launcher.start(
        2, generation=1, checkpoint_dir=checkpoints, env=TF_ITERATOR_LOG,
        args=("--epochs", "3", "--steps-per-epoch", "10", *QUICK,
              "--model-path", str(tmp_path / "model.keras")))
    assert [w.wait(timeout=150) for w in second] == [0, 0], launcher.logs()

    for worker in second:
        log = worker.log()
        assert "resuming from step 15 (epoch 2, batch 5)" in log
        assert "epoch 3/3 done: step 30" in log
        counts = (log.count(CREATED), log.count(DESTROYED))
        assert counts == (1, 0), f"worker {worker.index}: (created, destroyed) = {counts}"
