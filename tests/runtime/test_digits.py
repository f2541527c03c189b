"""The example the jobs in examples/ run: three real workers learn the UCI handwritten
digits and reach the held-out accuracy the README states, reporting accuracy in /progress."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.runtime.workers import DIGITS, Launcher
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)


def test_three_workers_learn_the_digits(launcher: Launcher, tmp_path: Path, report: Any) -> None:
    model = tmp_path / "model" / "digits.keras"
    workers = launcher.start(3, checkpoint_dir=tmp_path / "checkpoints", script=DIGITS,
                             args=("--model-path", str(model)))  # the example's defaults
    progress = wait_for(
        lambda: next((p for p in [workers[0].progress()]
                      if p and p["phase"] == "training" and p["accuracy"] is not None), None),
        timeout=150, interval=0.2, describe=launcher.logs)
    assert 0 <= progress["accuracy"] <= 1 and progress["loss"] > 0

    assert [w.wait(timeout=180) for w in workers] == [0, 0, 0], launcher.logs()
    accuracies = []
    for worker in workers:
        log = worker.log()
        assert "epoch 20/20 done" in log and "target reached" in log
        assert re.search(r"epoch 20/20 done: step \d+, loss [\d.e-]+, accuracy 0\.9\d*", log)
        found = re.search(r"held-out accuracy (\d\.\d+) on 360 images", log)
        assert found, log
        accuracies.append(float(found.group(1)))
    assert len(set(accuracies)) == 1 and accuracies[0] >= 0.9  # same replicated weights
    assert model.stat().st_size > 0
    report(f"digits, 3 workers, 20 epochs: held-out accuracy {accuracies[0]:.4f}")


def _digits_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_example", DIGITS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("counts", "held"), [
    ((178, 182, 177, 183, 181, 182, 181, 179, 174, 180), (36, 37, 35, 37, 36, 36, 36, 36, 35, 36)),
    ((5, 5), (1, 1)),  # 10 x 0.2 = 2: exact, no rounding
    ((3, 3, 1), (1, 1, 0)),  # ceil(1.4) = 2: the two largest remainders (0.6, 0.6) get them
])
def test_the_held_out_fifth_keeps_each_class_in_proportion(
        counts: tuple[int, ...], held: tuple[int, ...]) -> None:
    digits = _digits_module()
    labels = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(5).shuffle(labels)
    mask = digits.stratified_held_out(labels, 0.2, np.random.default_rng(0))
    assert tuple(np.bincount(labels[mask], minlength=len(counts))) == held
    again = digits.stratified_held_out(labels, 0.2, np.random.default_rng(0))
    assert (mask == again).all()  # every worker holds out the same images


def test_the_example_data_is_the_digits() -> None:
    (x_train, y_train), (x_test, y_test) = _digits_module().digits()
    assert x_train.shape == (1437, 64) and x_test.shape == (360, 64)
    assert 0 <= x_train.min() and x_train.max() <= 1 and x_train.dtype == np.float32
    assert sorted(set(y_train.tolist()) | set(y_test.tolist())) == list(range(10))
