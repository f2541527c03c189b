"""Checkpoints of different jobs do not mix: real groups refuse another job's checkpoint
(exit 2, both jobs and the allowing field named) and restore it when told to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.workers import Launcher, latest_checkpoint_step

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
