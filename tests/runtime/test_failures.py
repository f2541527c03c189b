"""Peer failures: a killed worker aborts the others (exit 4) and the group resumes; a stopped
worker freezes the others' progress until the collective aborts.

Measured on a 2-core machine shared with other builds, MWJ_COLLECTIVE_TIMEOUT_SECONDS=15 (the
heartbeat timeout and the runtime's collective watchdog, see runtime/strategy.py):
- SIGKILL of worker 1: its ring neighbour (worker 2) gets "Connection reset by peer" and exits
  4 within 0.3-0.4 s; worker 0 learns it from the coordination service, 9-15 s after the kill
  (a heartbeat timeout, or sooner when worker 2's error report reaches the service first).
- SIGSTOP of worker 1 (its TCP stack still accepts, so nothing resets): the others'
  /progress step stops advancing at once (the first 1 s sampling window already shows it
  frozen) and the stopped worker's /progress stops answering; the others exit 4 after
  10-12 s, when the coordination service declares the stopped worker's heartbeats missing.
The exact numbers of each run are printed as `[runtime] ...` lines.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from multiworker.api.contract import SURVIVOR_SAVED

from tests.runtime.workers import (
    COLLECTIVE_TIMEOUT,
    Launcher,
    Worker,
    latest_checkpoint_step,
    step_of,
    wait_exits,
)
from tests.support import wait_for

STUCK_SECONDS = 2.0  # runtime/survivors.py (which imports TensorFlow)

# Detection takes the timeout plus a heartbeat check interval; exiting is immediate (exits.py).
ABORT_SLACK = 10.0


def epochs_done(worker: Worker) -> list[int]:
    return [int(e) for e in re.findall(r"epoch (\d+)/\d+ done", worker.log())]


def survivor_step(worker: Worker) -> int | None:
    found = re.search(re.escape(SURVIVOR_SAVED) + r" (\d+)", worker.log())
    return int(found[1]) if found else None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("survivor_saves", [True, False], ids=["survivors-save", "periodic-only"])
def test_killed_worker_aborts_the_group_which_then_resumes(
    launcher: Launcher, tmp_path: Path, report: Any, survivor_saves: bool
) -> None:
    """A SIGKILLed worker aborts its peers (exit 4); each survivor saves its replica at the
    step its weights reflect before exiting, and the next group resumes from the newest of
    those saves — at most one step from where the group was — instead of the last periodic
    checkpoint (MWJ_SURVIVOR_SAVES=0: as before, up to a checkpoint interval lost)."""
    checkpoints = tmp_path / "checkpoints"
    every, per_epoch, epochs = 10, 20, 6
    args = (
        "--epochs",
        str(epochs),
        "--steps-per-epoch",
        str(per_epoch),
        "--checkpoint-every",
        str(every),
    )
    env = {} if survivor_saves else {"MWJ_SURVIVOR_SAVES": "0"}
    first = launcher.start(
        3, checkpoint_dir=checkpoints, args=(*args, "--step-sleep", "0.1"), env=env
    )
    wait_for(
        lambda: (step_of(first[0]) or 0) >= 2 * per_epoch + 5,
        timeout=120,
        interval=0.2,
        describe=launcher.logs,
    )

    first[1].signal(signal.SIGKILL)
    killed_at = time.monotonic()
    survivors = [first[0], first[2]]
    last_step = max(step_of(w) or 0 for w in survivors)
    exits = wait_exits(survivors, COLLECTIVE_TIMEOUT + ABORT_SLACK + 30, killed_at)

    report(f"SIGKILL worker 1 -> survivors exit: {exits} (index: (code, seconds))")
    assert {i: code for i, (code, _) in exits.items()} == {0: 4, 2: 4}, launcher.logs()
    assert max(s for _, s in exits.values()) <= COLLECTIVE_TIMEOUT + ABORT_SLACK
    for worker in survivors:
        assert "collective aborted" in worker.log()
    periodic = latest_checkpoint_step(checkpoints)
    assert 0 < periodic <= last_step and last_step - periodic <= every + 1
    saved = [s for w in survivors if (s := survivor_step(w)) is not None]
    if survivor_saves:
        assert saved and all(abs(s - last_step) <= 1 for s in saved), (saved, last_step)
        expected, origin = max(saved), "survivors of generation 0"
    else:
        assert not saved, launcher.logs()
        expected, origin = periodic, "checkpoint"

    second = launcher.start(
        3,
        generation=1,
        checkpoint_dir=checkpoints,
        args=(*args, "--step-sleep", "0.02"),
    )
    resumed = wait_for(
        lambda: second[2].progress() if step_of(second[2]) else None,
        timeout=120,
        interval=0.2,
        describe=launcher.logs,
    )
    codes = [w.wait(timeout=120) for w in second]

    assert codes == [0, 0, 0], launcher.logs()
    assert resumed["generation"] == 1 and resumed["restoredFromStep"] == expected
    assert resumed["restoredFrom"].startswith(origin), resumed
    for worker in second:
        assert f"resuming from step {expected} " in worker.log()
        assert "target reached" in worker.log()
        # Epochs completed before the checkpoint are not trained again.
        assert epochs_done(worker) == list(range(expected // per_epoch + 1, epochs + 1))
    report(f"restart resumed from step {expected} ({resumed['restoredFrom']}; killed at "
           f"~{last_step}, periodic checkpoint {periodic}, every {every}; survivors saved "
           f"{saved})")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("stopped", [1, 0], ids=["worker-1", "worker-0-the-leader"])
def test_stopped_worker_freezes_progress_until_the_collective_aborts(
    launcher: Launcher, report: Any, stopped: int
) -> None:
    """Worker 1 stopped is reported by the coordination service's heartbeats; worker 0 runs
    that service, so nobody reports it: the runtime's collective watchdog aborts the others
    (runtime/watchdog.py), as TensorFlow's per-collective timeout did."""
    args = ("--epochs", "50", "--steps-per-epoch", "20", "--step-sleep", "0.05")
    workers = launcher.start(3, args=args)
    wait_for(
        lambda: (step_of(workers[0]) or 0) >= 10,
        timeout=120,
        interval=0.2,
        describe=launcher.logs,
    )
    others = [w for w in workers if w.index != stopped]

    workers[stopped].signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    frozen = wait_for(
        lambda: frozen_step(others),
        timeout=COLLECTIVE_TIMEOUT,
        interval=0.1,
        describe="the others' steps to stop advancing",
    )
    frozen_after = time.monotonic() - stopped_at
    stopped_answers = workers[stopped].progress(timeout=2)
    exits = wait_exits(others, COLLECTIVE_TIMEOUT + ABORT_SLACK + 30, stopped_at)

    report(
        f"SIGSTOP worker {stopped} -> others' steps frozen at {frozen} after "
        f"{frozen_after:.1f}s; others exit: {exits} (index: (code, seconds))"
    )
    assert stopped_answers is None, "a stopped worker must not answer /progress"
    assert {i: code for i, (code, _) in exits.items()} == {w.index: 4 for w in others}, \
        launcher.logs()
    assert max(s for _, s in exits.values()) <= COLLECTIVE_TIMEOUT + ABORT_SLACK
    for worker in others:
        assert "collective aborted" in worker.log()


def frozen_step(workers: list[Worker], window: float = 1.0) -> int | None:
    """The furthest step of `workers`, if none of their steps moved for `window` seconds.

    Each worker is compared with itself: a ring all-reduce cut by the stopped peer can leave
    one survivor a step ahead of the other (each saves the step its own weights reflect)."""
    before = [step_of(w) for w in workers]
    time.sleep(window)
    after = [step_of(w) for w in workers]
    if before != after or None in after:
        return None
    return max(s for s in after if s is not None)


# 60 steps, no periodic checkpoint due before step 100: a resume comes from a survivor's save.
SHORT_RUN = ("--epochs", "3", "--steps-per-epoch", "20", "--checkpoint-every", "100")


def training_past(launcher: Launcher, checkpoints: Path, step: int) -> list[Worker]:
    """A group of 3 on SHORT_RUN, slowed down, once its chief is past `step`."""
    group = launcher.start(3, checkpoint_dir=checkpoints,
                           args=(*SHORT_RUN, "--step-sleep", "0.1"))
    wait_for(lambda: (step_of(group[0]) or 0) >= step, timeout=120, interval=0.2,
             describe=launcher.logs)
    return group


@pytest.mark.timeout(240)
def test_survivors_stuck_in_a_collective_save_on_sigterm_and_the_group_resumes_there(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    """A peer that hangs without resetting its connections (SIGSTOP here; a node powered off)
    leaves the others waiting in their collective, where no Python signal handler runs. The
    operator's SIGTERM (it tears the broken group down) still makes each of them save its
    replica and exit 143 at once, and the next group resumes there — not from step 0: no
    periodic checkpoint was due yet."""
    checkpoints = tmp_path / "checkpoints"
    first = training_past(launcher, checkpoints, 25)
    first[1].signal(signal.SIGSTOP)
    survivors = [first[0], first[2]]
    time.sleep(STUCK_SECONDS + 2)  # longer than any step: stuck
    last = max(step_of(w) or 0 for w in survivors)
    for worker in survivors:
        worker.signal(signal.SIGTERM)
    terminated = time.monotonic()
    exits = wait_exits(survivors, 30, terminated)
    first[1].signal(signal.SIGKILL)
    report(f"SIGSTOP worker 1, SIGTERM the others while stuck -> exits {exits}")
    assert {i: code for i, (code, _) in exits.items()} == {0: 143, 2: 143}, launcher.logs()
    assert max(s for _, s in exits.values()) < 5, exits
    # The step the weights reflect: the last one reported, or the next where the stopped peer
    # cut that step's collective after its gradients were applied (its loss never reported).
    saved = [survivor_step(w) for w in survivors]
    assert all(step in (last, last + 1) for step in saved), (saved, last, launcher.logs())
    assert not (checkpoints / "checkpoint").exists()  # no periodic checkpoint was due

    second = launcher.start(3, generation=1, checkpoint_dir=checkpoints, args=SHORT_RUN)
    codes = [w.wait(timeout=120) for w in second]
    assert codes == [0, 0, 0], launcher.logs()
    for worker in second:
        assert f"resuming from step {max(saved)} " in worker.log()


@pytest.mark.timeout(240)
def test_a_survivors_save_restores_into_a_group_of_one_worker_fewer(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A group of 3 loses a worker; its survivors' save restores into a group of 2 (what an
    elastic restart will do when the lost node has no replacement) and trains on from there."""
    checkpoints = tmp_path / "checkpoints"
    first = training_past(launcher, checkpoints, 15)
    first[2].signal(signal.SIGKILL)
    exits = wait_exits(first[:2], COLLECTIVE_TIMEOUT + ABORT_SLACK + 30, time.monotonic())
    assert {i: code for i, (code, _) in exits.items()} == {0: 4, 1: 4}, launcher.logs()
    saved = max(s for w in first[:2] if (s := survivor_step(w)) is not None)

    smaller = launcher.start(2, generation=1, checkpoint_dir=checkpoints, args=SHORT_RUN)
    codes = [w.wait(timeout=120) for w in smaller]
    assert codes == [0, 0], launcher.logs()
    for worker in smaller:
        assert f"resuming from step {saved} " in worker.log()
        assert "target reached" in worker.log()
