"""Checkpoints of different jobs do not mix: real groups refuse another job's checkpoint
(exit 2, both jobs and the allowing field named) and restore it when told to; a checkpoint
directory the workers do not all see is named at start (exit 2)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.workers import (
    Launcher,
    Worker,
    latest_checkpoint_step,
    loopback_group,
    wait_exits,
)

pytestmark = pytest.mark.timeout(240)

# Short runs; the synthetic target is beside the point here.
ARGS = ("--steps-per-epoch", "10", "--target-loss", "1000")


def identity(name: str, uid: str) -> dict[str, str]:
    return {"MWJ_JOB_NAME": name, "MWJ_JOB_NAMESPACE": "team", "MWJ_JOB_UID": uid}


def train_first_job(launcher: Launcher, directory: Path) -> list[str]:
    """Job `first` trains 2 epochs (20 steps) into `directory`; returns its files."""
    group = launcher.start(2, checkpoint_dir=directory, args=(*ARGS, "--epochs", "2"),
                           env=identity("first", "uid-1"))
    assert [w.wait(timeout=150) for w in group] == [0, 0], launcher.logs()
    assert latest_checkpoint_step(directory) == 20
    assert json.loads((directory / "job.json").read_text()) == {
        "name": "first", "namespace": "team", "uid": "uid-1"}
    return sorted(p.name for p in directory.iterdir())


def test_a_checkpoint_of_another_job_is_refused_with_exit_2(
    launcher: Launcher, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    train_first_job(launcher, shared)

    second = launcher.start(2, generation=0, checkpoint_dir=shared,
                            args=(*ARGS, "--epochs", "4"), env=identity("second", "uid-2"))

    assert [w.wait(timeout=150) for w in second] == [2, 2], launcher.logs()
    for worker in second:
        log = worker.log()
        assert "checkpoint of job team/first (uid uid-1), not of this job team/second " \
               "(uid uid-2)" in log, log
        assert "spec.checkpoint.resumeFrom" in log
        assert "epoch 1/4 done" not in log
    assert latest_checkpoint_step(shared) == 20  # untouched


def test_resume_from_restores_another_jobs_checkpoint_on_purpose(
    launcher: Launcher, tmp_path: Path
) -> None:
    earlier, own = tmp_path / "first", tmp_path / "second"
    files_before = train_first_job(launcher, earlier)

    second = launcher.start(2, checkpoint_dir=own, args=(*ARGS, "--epochs", "3"),
                            env={**identity("second", "uid-2"),
                                 "MWJ_RESUME_FROM_DIR": str(earlier)})

    assert [w.wait(timeout=150) for w in second] == [0, 0], launcher.logs()
    for worker in second:
        log = worker.log()
        assert "resuming on purpose (spec.checkpoint.resumeFrom)" in log
        assert "written by job team/first (uid uid-1)" in log
        assert "resuming from step 20 (epoch 3, batch 0)" in log
        assert "epoch 3/3 done: step 30" in log
    assert latest_checkpoint_step(own) == 30
    assert json.loads((own / "job.json").read_text())["uid"] == "uid-2"
    assert sorted(p.name for p in earlier.iterdir()) == files_before
    assert latest_checkpoint_step(earlier) == 20


def split_group(
    launcher: Launcher, directories: tuple[Path, Path], generation: int, args: tuple[str, ...]
) -> list[Worker]:
    """One group of 2 whose workers see different directories as MWJ_CHECKPOINT_DIR, as on
    two nodes with node-local volumes; worker i runs on node "node-<a|b>"."""
    peers, ports = loopback_group(2)
    return [
        worker
        for index, directory in enumerate(directories)
        for worker in launcher.start(
            2, generation=generation, checkpoint_dir=directory, peers=peers,
            progress_ports=ports, only=(index,), args=args,
            env={"MWJ_NODE_NAME": f"node-{'ab'[index]}"})
    ]


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def assert_unshared_named(group: list[Worker]) -> None:
    """Exit 2 on both, each naming the worker it cannot see and its own node, before any
    restore or training."""
    for worker, other in zip(group, reversed(group), strict=True):
        log = worker.log()
        assert worker.process.poll() == 2, log
        assert (f"is not shared by all workers: worker-{worker.index} (node "
                f"node-{'ab'[worker.index]}) cannot see what worker-{other.index} wrote there "
                "within 7.5s; it must be storage every worker shares") in log, log
        assert "(exit 2)" in log
        assert "restored " not in log and "epoch 1/" not in log and "found step" not in log


def test_workers_that_do_not_see_one_checkpoint_volume_exit_2_naming_it(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    """A node-local volume: worker 0 finds the last group's checkpoint, worker 1 an empty
    directory. Neither sees the other's marker, so both name the volume (exit 2) before the
    first collective that could differ between them — restoring builds the optimizer's slots
    under the strategy (a broadcast) — instead of aborting in mismatched collectives (exit 4,
    a restart spent). The look lasts half the collective timeout here (7.5 s of 15 s)."""
    seen_by_0, seen_by_1 = tmp_path / "node-a", tmp_path / "node-b"
    first = launcher.start(2, checkpoint_dir=seen_by_0, args=(*ARGS, "--epochs", "2"))
    assert [w.wait(timeout=150) for w in first] == [0, 0], launcher.logs()
    seen_by_1.mkdir()

    started = time.monotonic()
    group = split_group(launcher, (seen_by_0, seen_by_1), 1, (*ARGS, "--epochs", "4"))
    exits = wait_exits(group, 150, started)

    report(f"unshared volume, earlier checkpoint: launch -> exit {exits} (index: (code, s))")
    assert_unshared_named(group)
    assert latest_checkpoint_step(seen_by_0) == 20  # nothing restored, trained or saved
    assert files_under(seen_by_1) == ["markers", "markers/g1", "markers/g1/worker-1.json"]


def test_a_fresh_job_on_an_unshared_volume_exits_2_before_training(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    """Without a checkpoint both workers found step 0, so nothing was caught before: the job
    trained, and every restart silently started over on a node-local volume."""
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"

    started = time.monotonic()
    group = split_group(launcher, (node_a, node_b), 0, (*ARGS, "--epochs", "2"))
    exits = wait_exits(group, 150, started)

    report(f"unshared volume, fresh job: launch -> exit {exits} (index: (code, s))")
    assert_unshared_named(group)
    assert files_under(node_a) == ["fence.json", "markers", "markers/g0",
                                   "markers/g0/worker-0.json"]
    assert files_under(node_b) == ["markers", "markers/g0", "markers/g0/worker-1.json"]


def test_workers_that_found_different_checkpoints_exit_2_naming_the_steps(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Markers every worker sees, checkpoints they do not (a volume shared in part): the
    step check still names each worker's step."""
    seen_by_0, seen_by_1 = tmp_path / "node-a", tmp_path / "node-b"
    first = launcher.start(2, checkpoint_dir=seen_by_0, args=(*ARGS, "--epochs", "2"))
    assert [w.wait(timeout=150) for w in first] == [0, 0], launcher.logs()
    seen_by_1.mkdir()
    (seen_by_1 / "markers").symlink_to(seen_by_0 / "markers")

    group = split_group(launcher, (seen_by_0, seen_by_1), 1, (*ARGS, "--epochs", "4"))

    assert [w.wait(timeout=150) for w in group] == [2, 2], launcher.logs()
    assert "worker 0 found step 20" in group[0].log(), group[0].log()
    assert "worker 1 found step 0" in group[1].log(), group[1].log()
    for worker in group:
        assert "the directory must be storage shared by all workers" in worker.log()
        assert "2 of 2 workers' markers visible" in worker.log()
    assert latest_checkpoint_step(seen_by_0) == 20
    assert sorted(p.name for p in seen_by_1.iterdir()) == ["markers"]  # nothing trained


def cut_short(directory: Path, step: int) -> None:
    """What a node crash leaves of a save whose data never reached the volume: its files
    listed, its data file empty."""
    for data in directory.glob(f"ckpt-{step}.data-*"):
        data.write_bytes(b"")


def train_on_after_cutting_short(launcher: Launcher, shared: Path, *steps: int) -> list[Worker]:
    """Job `first` trains 2 epochs (ckpt-10 and ckpt-20 kept), the checkpoints of `steps`
    are cut short, and its next generation starts for a third epoch."""
    train_first_job(launcher, shared)
    for step in steps:
        cut_short(shared, step)
    return launcher.start(2, generation=1, checkpoint_dir=shared, args=(*ARGS, "--epochs", "3"),
                          env=identity("first", "uid-1"))


def test_a_newest_checkpoint_cut_short_is_passed_over_for_the_one_before_and_said(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Before, the unreadable newest checkpoint failed every restart the same way (and the
    job with it). All workers pass over it together and resume from the one before."""
    shared = tmp_path / "shared"
    group = train_on_after_cutting_short(launcher, shared, 20)
    assert [w.wait(timeout=150) for w in group] == [0, 0], launcher.logs()
    for worker in group:
        log = worker.log()
        assert f"cannot restore {shared}/ckpt-20 (" in log, log
        assert "trying the next newest" in log
        # What the run's restoredFrom (status.progress.resumedFrom) says, too.
        assert f"restored {shared}/ckpt-10 (checkpoint; unreadable, passed over: ckpt-20)" \
            in log, log
        assert "resuming from step 10 (epoch 2, batch 0)" in log
        assert "epoch 3/3 done: step 30" in log
    assert latest_checkpoint_step(shared) == 30


def test_no_readable_checkpoint_stops_the_group_with_exit_2_naming_them(
    launcher: Launcher, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    group = train_on_after_cutting_short(launcher, shared, 20, 10)
    assert [w.wait(timeout=150) for w in group] == [2, 2], launcher.logs()
    for worker in group:
        log = worker.log()
        assert f"no checkpoint in {shared} could be restored ({shared}/ckpt-20: " in log, log
        assert f"; {shared}/ckpt-10: " in log
        assert "epoch 1/3 done" not in log
