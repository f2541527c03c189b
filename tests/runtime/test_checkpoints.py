"""Checkpoints of different jobs do not mix: real groups refuse another job's checkpoint
(exit 2, both jobs and the allowing field named) and restore it when told to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.workers import Launcher, free_port, latest_checkpoint_step

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


def test_workers_that_do_not_see_one_checkpoint_volume_exit_2_naming_it(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A node-local volume: worker 0 finds the last group's checkpoint, worker 1 an empty
    directory. They must agree on the step before any other collective — restoring builds the
    optimizer's slots under the strategy (a broadcast) — or they abort in mismatched
    collectives (exit 4, a restart spent) instead of naming the volume (exit 2)."""
    seen_by_0, seen_by_1 = tmp_path / "node-a", tmp_path / "node-b"
    first = launcher.start(2, checkpoint_dir=seen_by_0, args=(*ARGS, "--epochs", "2"))
    assert [w.wait(timeout=150) for w in first] == [0, 0], launcher.logs()
    seen_by_1.mkdir()

    peers = [f"localhost:{free_port()}" for _ in range(2)]
    ports = [free_port() for _ in range(2)]
    group = [*launcher.start(2, generation=1, checkpoint_dir=seen_by_0, peers=peers,
                             progress_ports=ports, only=(0,), args=(*ARGS, "--epochs", "4")),
             *launcher.start(2, generation=1, checkpoint_dir=seen_by_1, peers=peers,
                             progress_ports=ports, only=(1,), args=(*ARGS, "--epochs", "4"))]

    assert [w.wait(timeout=150) for w in group] == [2, 2], launcher.logs()
    assert "worker 0 found step 20" in group[0].log(), group[0].log()
    assert "worker 1 found step 0" in group[1].log(), group[1].log()
    for worker in group:
        assert "the directory must be storage shared by all workers" in worker.log()
    assert not list(seen_by_1.iterdir())  # nothing trained, nothing written
