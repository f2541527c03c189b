"""A group of an older generation never writes a checkpoint, nor its final model, once a newer
one claimed the directory (fence.json): it stops at its next save, or before training, with
exit 5."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import keras
import pytest
from multiworker.runtime.checkpoint import save_model
from multiworker.runtime.config import load_config
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import Superseded
from multiworker.runtime.fence import FENCE_FILE, Fence, claim
from multiworker.runtime.preemption import StopSignal
from multiworker.runtime.progress import ProgressBoard
from multiworker.runtime.watchdog import CollectiveWatchdog

from tests.runtime.workers import Launcher, latest_checkpoint_step, wait_exits
from tests.support import wait_for

JOB = {"MWJ_JOB_UID": "uid-1"}
# Checkpoints every 5 steps; the synthetic target is beside the point here.
ARGS = ("--steps-per-epoch", "40", "--checkpoint-every", "5", "--target-loss", "1000")
STOPPED = re.compile(
    r"superseded: generation 1 of this job claimed MWJ_CHECKPOINT_DIR \S+ \(fence.json, pod "
    r"\S+, at \d\d:\d\d:\d\d UTC\); this trainer is generation 0 and stops at step (\d+) "
    r"without saving \(exit 5\)"
)


@pytest.mark.timeout(360)
def test_a_replaced_group_still_running_stops_before_its_next_save(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    """Generation 0 keeps training slowly (a pod its node never heard was deleted); generation
    1 starts on the same directory, resumes from it and finishes. Generation 0 stops at its
    first save after the claim, without saving."""
    checkpoints = tmp_path / "checkpoints"
    old = launcher.start(2, generation=0, checkpoint_dir=checkpoints, env=JOB,
                         args=(*ARGS, "--epochs", "100", "--step-sleep", "0.2"))
    wait_for(lambda: (checkpoints / "checkpoint").exists(), timeout=150, interval=0.2,
             describe=launcher.logs)

    started = time.monotonic()
    new = launcher.start(2, generation=1, checkpoint_dir=checkpoints, env=JOB,
                         args=(*ARGS, "--epochs", "8"))
    old_exits = wait_exits(old, 150, started)
    new_codes = [w.wait(timeout=200) for w in new]

    report(f"old generation after the new one's launch: {old_exits} (index: (code, s))")
    assert {i: code for i, (code, _) in old_exits.items()} == {0: 5, 1: 5}, launcher.logs()
    assert new_codes == [0, 0], launcher.logs()
    stopped = {int(m) for w in old for m in STOPPED.findall(w.log())}
    assert len(stopped) == 1, launcher.logs()  # both workers, at the same step: a save's
    (stopped_at,) = stopped
    saved = [int(s) for s in re.findall(r"checkpoint saved: \S+/ckpt-(\d+)", old[0].log())]
    assert saved and stopped_at % 5 == 0 and max(saved) < stopped_at, old[0].log()
    resumed = re.search(r"resuming from step (\d+)", new[0].log())
    assert resumed and int(resumed.group(1)) in saved, new[0].log()
    for worker in new:
        assert "epoch 8/8 done: step 320" in worker.log()
    assert latest_checkpoint_step(checkpoints) == 320
    assert json.loads((checkpoints / FENCE_FILE).read_text())["generation"] == 1
    assert sorted(p.name for p in (checkpoints / "markers").iterdir()) == ["g1"]


@pytest.mark.timeout(120)
def test_a_group_of_an_older_generation_exits_5_before_training(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A pod of a replaced group that starts late (its node was cut off) finds generation 1's
    claim: it touches nothing, and its peers stop with it instead of timing out."""
    checkpoints = tmp_path / "checkpoints"
    claim(str(checkpoints), Fence(1, "uid-1", "runtime-test-worker-0", time.time()))
    before = (checkpoints / FENCE_FILE).read_text()

    late = launcher.start(2, generation=0, checkpoint_dir=checkpoints, env=JOB,
                          args=(*ARGS, "--epochs", "2"))

    assert [w.wait(timeout=90) for w in late] == [5, 5], launcher.logs()
    for worker in late:
        log = worker.log()
        assert ("superseded: generation 1 of this job claimed MWJ_CHECKPOINT_DIR "
                f"{checkpoints} (fence.json, pod runtime-test-worker-0, at ") in log, log
        assert "this trainer is generation 0 and stops before training without saving " \
               "(exit 5)" in log
        assert "epoch 1/" not in log
    assert sorted(p.name for p in checkpoints.iterdir()) == [FENCE_FILE]  # no marker either
    assert (checkpoints / FENCE_FILE).read_text() == before


@pytest.mark.parametrize(("claimed", "saved"), [(0, True), (1, False)])
def test_the_final_model_is_fenced_like_a_checkpoint(
    tmp_path: Path, claimed: int, saved: bool
) -> None:
    """A replaced group that still finishes training must not overwrite the model its
    successor saves: save_model reads the fence first (here one worker, in this process)."""
    checkpoints = tmp_path / "checkpoints"
    claim(str(checkpoints), Fence(claimed, "uid-1", "runtime-test-worker-0", time.time()))
    config = load_config({"MWJ_JOB_UID": "uid-1", "MWJ_CHECKPOINT_DIR": str(checkpoints),
                          "MWJ_RESTART_COUNT": "0", "MWJ_PROGRESS_PORT": "0"})
    context = WorkerContext(config=config, progress=ProgressBoard(0, 0), stop=StopSignal(),
                            watchdog=CollectiveWatchdog(config.collective_timeout_seconds))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    target = tmp_path / "model" / "final.keras"

    if saved:
        save_model(context, model, str(target))
    else:
        with pytest.raises(Superseded, match=r"generation 1 of this job claimed .*; this "
                           r"trainer is generation 0 and stops at step 0 without saving"):
            save_model(context, model, str(target))
    assert target.exists() == saved
