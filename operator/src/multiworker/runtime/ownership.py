"""Whose checkpoint is this: the identity file beside a job's checkpoints, and the rule for
which checkpoint a job may restore (stdlib only; TensorFlow's lookup is passed in).

A checkpoint holds model and optimizer state, step included, so restoring another job's
checkpoint silently continues that job's training: a new job on a shared claim would report
the old job's final step and finish without training. The operator gives each job its own
directory; this check catches whatever still puts a foreign checkpoint there (a hand-set
MWJ_CHECKPOINT_DIR, another launcher, files copied in), and `MWJ_RESUME_FROM_DIR`
(spec.checkpoint.resumeFrom) is the one way to restore another run's state on purpose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from multiworker.api.contract import MWJ_CHECKPOINT_DIR, MWJ_RESUME_FROM_DIR
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.errors import ConfigError
from multiworker.runtime.files import read_json, write_json

log = logging.getLogger(__name__)

IDENTITY_FILE = "job.json"
RESUME_FIELD = "spec.checkpoint.resumeFrom"
LatestCheckpoint = Callable[[str], str | None]  # directory -> latest checkpoint path, or None


@dataclass(frozen=True)
class JobIdentity:
    """The job that wrote a checkpoint directory; the uid tells a re-created job apart."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, config: RuntimeConfig) -> JobIdentity:
        return cls(config.job_name, config.job_namespace, config.job_uid)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{where} (uid {self.uid or 'unset'})"


def read_identity(directory: str) -> JobIdentity | None:
    """The identity recorded in `directory`, or None when there is none or it is unreadable."""
    try:
        fields = read_json(os.path.join(directory, IDENTITY_FILE))
        return JobIdentity(str(fields["name"]), str(fields["namespace"]), str(fields["uid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_identity(directory: str, identity: JobIdentity) -> None:
    """Records `identity` in `directory` atomically (a crash never leaves half a file)."""
    write_json(os.path.join(directory, IDENTITY_FILE), asdict(identity))


def restore_source(config: RuntimeConfig, latest: LatestCheckpoint) -> str | None:
    """The checkpoint this job restores: its own latest (which must be its own), else the
    latest in MWJ_RESUME_FROM_DIR, else None (start at step 0). Raises ConfigError (exit 2)
    for another job's checkpoint in its own directory, or for a resume source without one."""
    own_dir = config.checkpoint_dir
    if own_dir is None:
        return None
    own = latest(own_dir)
    if own is not None:
        if os.path.normpath(own_dir) != os.path.normpath(config.resume_from_dir or ""):
            _check_owner(own_dir, JobIdentity.of(config))
        return own
    if config.resume_from_dir is None:
        return None
    found = latest(config.resume_from_dir)
    if found is None:
        raise ConfigError([
            f"{MWJ_RESUME_FROM_DIR} ({RESUME_FIELD}): no checkpoint in {config.resume_from_dir}"
            " to resume from; fix the path (relative to spec.checkpoint.mountPath) or remove "
            "the field to start from step 0"
        ])
    writer = read_identity(config.resume_from_dir)
    log.info("resuming on purpose (%s) from %s, written by job %s", RESUME_FIELD, found,
             writer or "unknown")
    return found


def _check_owner(directory: str, ours: JobIdentity) -> None:
    writer = read_identity(directory)
    if writer == ours:
        return
    whose = (f"job {writer}" if writer is not None
             else f"an unknown job (no {IDENTITY_FILE} identity file)")
    raise ConfigError([
        f"{MWJ_CHECKPOINT_DIR} {directory} holds a checkpoint of {whose}, not of this job "
        f"{ours}: refusing to continue another job's training. To resume from it on purpose, "
        f"set {RESUME_FIELD} to that directory relative to spec.checkpoint.mountPath "
        f"({MWJ_RESUME_FROM_DIR} outside the operator)"
    ])
