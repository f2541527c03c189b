"""The generation fence: which group of a job may still write to MWJ_CHECKPOINT_DIR.

A group restart deletes the old pods, but a pod can outlive its deletion: on a node cut off
from the control plane it keeps running (its kubelet never hears of the deletion), and a
container restarted in place keeps its old generation. Such a trainer must not overwrite the
checkpoints of the group that replaced it, or the next restart resumes from a replaced group's
state. So each group's chief records its generation in `fence.json` before restoring, and
every worker reads the file before each save: a newer generation there means stop
(Superseded, exit 5).

A file, not a lock: a save already under way when the fence moves may still complete; no save
starts once a worker has seen a newer generation. Another job's fence (another uid, from a
hand-set MWJ_CHECKPOINT_DIR) is not this job's and is claimed over; a missing or garbled fence
never blocks a save.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any

from multiworker.api.contract import MWJ_CHECKPOINT_DIR
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.files import read_json, write_json

log = logging.getLogger(__name__)

FENCE_FILE = "fence.json"


@dataclass(frozen=True)
class Fence:
    """A claim on the directory: the generation of the job (uid) whose chief (pod) wrote it."""

    generation: int
    job_uid: str
    pod: str
    written_at: float

    def supersedes(self, mine: Fence) -> bool:
        return self.job_uid == mine.job_uid and self.generation > mine.generation

    def document(self) -> dict[str, Any]:
        return {"generation": self.generation, "jobUid": self.job_uid, "pod": self.pod,
                "writtenAt": round(self.written_at, 3)}


def own_fence(config: RuntimeConfig) -> Fence:
    """This trainer's claim: its generation, job and pod (the hostname), as of now."""
    return Fence(config.restart_count, config.job_uid, socket.gethostname(), time.time())


def read_fence(directory: str) -> Fence | None:
    """The fence in `directory`; None when there is none, or (with a warning) when it is
    unreadable or garbled: a broken file must not stop a healthy group."""
    path = os.path.join(directory, FENCE_FILE)
    try:
        fields = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("%s is unreadable, ignored: %s", path, e)
        return None
    fence = _parse(fields)
    if fence is None:
        log.warning("%s is garbled, ignored: %.200r", path, fields)
    return fence


def claim(directory: str, mine: Fence) -> Fence | None:
    """The chief's claim at start: returns the fence of a newer generation of this job (and
    writes nothing), else records `mine`."""
    current = read_fence(directory)
    if current is not None and current.supersedes(mine):
        return current
    write_json(os.path.join(directory, FENCE_FILE), mine.document())
    return None


def check(directory: str, mine: Fence, *, reclaim: bool) -> Fence | None:
    """Before a save: the fence of a newer generation, or None. With `reclaim` (the chief),
    records `mine` again where the file no longer holds it (absent, garbled, an older
    generation, another job): two chiefs that claimed at once may have left the older claim
    last, and the newer one's next save restores it."""
    current = read_fence(directory)
    if current is not None and current.supersedes(mine):
        return current
    if reclaim and (current is None or (current.job_uid, current.generation)
                    != (mine.job_uid, mine.generation)):
        log.info("%s did not hold generation %d: claimed again", FENCE_FILE, mine.generation)
        try:
            write_json(os.path.join(directory, FENCE_FILE),
                       replace(mine, written_at=time.time()).document())
        except OSError as e:  # the save itself says what is wrong with the directory
            log.warning("could not claim %s again: %s", FENCE_FILE, e)
    return None


def superseded_message(
    directory: str, newer: Fence | None, generation: int, step: int | None
) -> str:
    """Why this trainer stops (`step` None: before training); `newer` is None when only
    another worker of the group saw the fence."""
    if newer is None:
        claimed = (f"another worker of this group found a newer generation in "
                   f"{MWJ_CHECKPOINT_DIR} {directory} ({FENCE_FILE})")
    else:
        at = time.strftime("%H:%M:%S", time.gmtime(newer.written_at))
        claimed = (f"generation {newer.generation} of this job claimed {MWJ_CHECKPOINT_DIR} "
                   f"{directory} ({FENCE_FILE}, pod {newer.pod}, at {at} UTC)")
    when = "before training" if step is None else f"at step {step}"
    return (f"superseded: {claimed}; this trainer is generation {generation} and stops "
            f"{when} without saving")


def _parse(fields: Any) -> Fence | None:
    if not isinstance(fields, dict):
        return None
    generation, uid = fields.get("generation"), fields.get("jobUid")
    pod, written_at = fields.get("pod"), fields.get("writtenAt")
    if (isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
            or isinstance(written_at, bool) or not isinstance(written_at, int | float)
            or not isinstance(uid, str) or not isinstance(pod, str)):
        return None
    return Fence(generation, uid, pod, float(written_at))
