"""SIGTERM (suspend, eviction, a group restart) checkpoints the whole group and exits 143."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from multiworker.runtime.preemption import StopSignal

from tests.runtime.workers import (
    Launcher,
    latest_checkpoint_step,
    loopback_group,
    step_of,
    wait_exits,
)
from tests.support import wait_for


@pytest.mark.timeout(180)
def test_sigterm_on_one_worker_checkpoints_the_group_and_restart_resumes(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    checkpoints = tmp_path / "checkpoints"
    per_epoch = (
        100  # checkpoints only at epoch ends, so a mid-epoch one comes from SIGTERM
    )
    args = ("--epochs", "2", "--steps-per-epoch", str(per_epoch))
    first = launcher.start(
        2, checkpoint_dir=checkpoints, args=(*args, "--step-sleep", "0.05")
    )
    wait_for(
        lambda: (step_of(first[0]) or 0) >= 10,
        timeout=120,
        interval=0.2,
        describe=launcher.logs,
    )

    first[1].signal(signal.SIGTERM)  # only one worker: the other must stop with it
    sent_at = time.monotonic()
    exits = wait_exits(first, 30, sent_at)

    report(f"SIGTERM worker 1 -> exits: {exits} (index: (code, seconds))")
    assert {i: code for i, (code, _) in exits.items()} == {0: 143, 1: 143}, (
        launcher.logs()
    )
    saved = latest_checkpoint_step(checkpoints)
    assert 10 <= saved < per_epoch
    for worker in first:
        assert f"checkpointed step {saved} and stopped" in worker.log()

    second = launcher.start(2, generation=1, checkpoint_dir=checkpoints, args=args)
    codes = [w.wait(timeout=120) for w in second]

    assert codes == [0, 0], launcher.logs()
    for worker in second:
        log = worker.log()
        assert f"resuming from step {saved} (epoch 1, batch {saved})" in log
        assert re.findall(r"epoch (\d)/2 done: step (\d+)", log) == [
            ("1", str(per_epoch)),
            ("2", str(2 * per_epoch)),
        ]
        assert "target reached" in log


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sigterm", [True, False], ids=["sigterm", "no-signal"])
def test_a_trainer_superseded_in_place_exits_at_once(
    launcher: Launcher, tmp_path: Path, report: Any, sigterm: bool
) -> None:
    """Its pod holds a newer generation (an in-place restart, docs/contracts.md): the group is
    broken, so the trainer stops without trying to agree on a checkpoint — on the kubelet's
    SIGTERM, and without any signal on the agent's word alone (MWJ_POD_GENERATION_FILE), so
    the old trainer is gone before the kubelet even restarts the pod's containers."""
    moved, stays = tmp_path / "moved", tmp_path / "stays"
    moved.write_text("0")
    stays.write_text("0")
    peers, ports = loopback_group(2)
    args = ("--epochs", "2", "--steps-per-epoch", "400", "--step-sleep", "0.05")
    workers = [
        launcher.start(2, only=(index,), peers=peers, progress_ports=ports, args=args,
                       checkpoint_dir=tmp_path / "checkpoints",
                       env={"MWJ_POD_GENERATION_FILE": str(generation)})[0]
        for index, generation in enumerate((stays, moved))
    ]
    wait_for(lambda: (step_of(workers[0]) or 0) >= 10, timeout=120, interval=0.2,
             describe=launcher.logs)
    moved.write_text("1")
    if sigterm:
        workers[1].signal(signal.SIGTERM)
    moved_at = time.monotonic()
    code = workers[1].wait(timeout=30)
    seconds = time.monotonic() - moved_at
    report(f"worker 1's pod moved to generation 1 ({'SIGTERM' if sigterm else 'no signal'}) "
           f"-> exit {code} in {seconds:.2f}s")
    assert code == 143, launcher.logs()
    assert "restarts in place as a newer generation: exiting at once" in workers[1].log()
    assert "checkpointed step" not in workers[1].log()
    workers[0].signal(signal.SIGKILL)


def test_a_superseded_trainer_writing_the_survivors_copy_finishes_it_first() -> None:
    """The SIGTERM of an in-place restart reaches the main thread between the parts of its
    survivors' save: exiting there would leave its parts unwritten. It exits once the save is
    done instead (the collective's abort, exit 4)."""
    stop = StopSignal(superseded=lambda: True)
    stop.saving = lambda: True
    stop._handle(signal.SIGTERM, None)
    assert stop.requested()
