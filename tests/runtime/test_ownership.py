"""Which checkpoint a job may restore (ownership.py), without TensorFlow: the lookup of the
latest checkpoint is the directory's `latest` marker file here."""

from __future__ import annotations

from pathlib import Path

import pytest
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.errors import ConfigError
from multiworker.runtime.ownership import (
    IDENTITY_FILE,
    JobIdentity,
    read_identity,
    restore_source,
    write_identity,
)

OURS = JobIdentity("digits", "ml", "uid-2")
EARLIER = JobIdentity("digits", "ml", "uid-1")


def config(checkpoint_dir: Path | None, resume_from: Path | None = None) -> RuntimeConfig:
    return RuntimeConfig(
        job_name=OURS.name, job_namespace=OURS.namespace, job_uid=OURS.uid,
        worker_index=0, peers=(), restart_count=0,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        resume_from_dir=None if resume_from is None else str(resume_from),
        progress_port=0, peer_timeout_seconds=1, collective_timeout_seconds=1,
    )


def latest(directory: str) -> str | None:
    marker = Path(directory) / "latest"
    return str(Path(directory) / marker.read_text()) if marker.exists() else None


def checkpointed(directory: Path, writer: JobIdentity | None, step: int = 40) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "latest").write_text(f"ckpt-{step}")
    if writer is not None:
        write_identity(str(directory), writer)
    return directory / f"ckpt-{step}"


def refusal(cfg: RuntimeConfig) -> str:
    with pytest.raises(ConfigError) as raised:
        restore_source(cfg, latest)
    return str(raised.value)


def test_identity_round_trips_and_is_readable_json(tmp_path: Path) -> None:
    write_identity(str(tmp_path / "new"), OURS)
    assert read_identity(str(tmp_path / "new")) == OURS
    assert (tmp_path / "new" / IDENTITY_FILE).read_text() == (
        '{"name": "digits", "namespace": "ml", "uid": "uid-2"}\n'
    )
    assert [p.name for p in (tmp_path / "new").iterdir()] == [IDENTITY_FILE]  # no temp left
    assert read_identity(str(tmp_path / "none")) is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / IDENTITY_FILE).write_text("{not json")
    assert read_identity(str(tmp_path / "bad")) is None


def test_nothing_to_restore_starts_at_step_zero(tmp_path: Path) -> None:
    assert restore_source(config(None), latest) is None
    assert restore_source(config(tmp_path / "empty"), latest) is None


def test_own_checkpoint_is_restored(tmp_path: Path) -> None:
    own = checkpointed(tmp_path / "own", OURS)
    assert restore_source(config(tmp_path / "own"), latest) == str(own)


def test_another_jobs_checkpoint_is_refused_naming_both_jobs_and_the_field(
    tmp_path: Path,
) -> None:
    checkpointed(tmp_path / "own", EARLIER)
    message = refusal(config(tmp_path / "own"))
    assert "ml/digits (uid uid-1)" in message and "this job ml/digits (uid uid-2)" in message
    assert "spec.checkpoint.resumeFrom" in message and "MWJ_RESUME_FROM_DIR" in message


def test_checkpoint_without_identity_is_refused(tmp_path: Path) -> None:
    checkpointed(tmp_path / "own", None)
    assert "an unknown job (no job.json" in refusal(config(tmp_path / "own"))


def test_resume_from_allows_another_jobs_checkpoint(tmp_path: Path) -> None:
    earlier = checkpointed(tmp_path / "earlier", EARLIER)
    assert restore_source(config(tmp_path / "own", tmp_path / "earlier"), latest) == str(earlier)
    # ... and naming the job's own directory allows what is already there.
    checkpointed(tmp_path / "own", EARLIER, step=80)
    assert restore_source(config(tmp_path / "own", tmp_path / "own/"), latest) == str(
        tmp_path / "own" / "ckpt-80"
    )


def test_own_checkpoints_win_over_the_resume_source(tmp_path: Path) -> None:
    """After a deliberate resume the job saved its own; a restart continues from those."""
    checkpointed(tmp_path / "earlier", EARLIER, step=40)
    own = checkpointed(tmp_path / "own", OURS, step=60)
    assert restore_source(config(tmp_path / "own", tmp_path / "earlier"), latest) == str(own)


def test_resume_source_without_a_checkpoint_is_a_configuration_error(tmp_path: Path) -> None:
    message = refusal(config(tmp_path / "own", tmp_path / "typo"))
    assert "spec.checkpoint.resumeFrom" in message and str(tmp_path / "typo") in message
