"""The example the jobs in examples/ run: three real workers learn scikit-learn's handwritten
digits and reach the held-out accuracy the README states, reporting accuracy in /progress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
