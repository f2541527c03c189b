"""A real group of TensorFlow workers trains the example to its target loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.workers import Launcher
from tests.support import wait_for

pytestmark = pytest.mark.timeout(150)


def test_three_workers_reach_the_target(launcher: Launcher, tmp_path: Path) -> None:
    workers = launcher.start(
        3,
        checkpoint_dir=tmp_path / "checkpoints",
        args=(
            *("--epochs", "4", "--steps-per-epoch", "30", "--step-sleep", "0.02"),
            *("--model-path", str(tmp_path / "model" / "final.keras")),
        ),
    )
    training = wait_for(
        lambda: next(
            (
                p
                for p in [workers[1].progress()]
                if p and p["phase"] == "training" and p["step"]
            ),
            None,
        ),
        timeout=90,
        interval=0.2,
        describe=launcher.logs,
    )
    assert training["workerIndex"] == 1 and training["generation"] == 0

    codes = [w.wait(timeout=90) for w in workers]

    assert codes == [0, 0, 0], launcher.logs()
    for worker in workers:
        log = worker.log()
        assert "epoch 4/4 done: step 120" in log
        assert "target reached" in log
    assert (
        tmp_path / "model" / "final.keras"
    ).stat().st_size > 0  # only the chief writes it
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["final.keras"]
