"""Pure: a group's start-up — which workers it still waits for, when it began, when the
start-up timeout ends it — and whether a worker's failure came before the group's first step:
the exception a script raises before training, which fails the same way every time it is
restarted (policy.py decides what to do with it).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from multiworker.api.contract import PEER_FAILURE_EXIT_CODES
from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.progress import GroupHealth
from multiworker.decide.tracebacks import ScriptError, script_error
from multiworker.decide.workers import (
    STOPPING_OLD_TRAINER,
    WAITING_FOR_RELEASE,
    WorkerPhase,
    WorkerState,
)

# A script that serves no progress: a failure this soon after its trainer started counts as
# its start-up's (startup_error).
UNREPORTED_STARTUP_SECONDS = 300


def startup_error(worker: WorkerState, health: GroupHealth | None,
                  generation: int) -> ScriptError | None:
    """The exception `worker` died of when its group `generation` had trained no step yet —
    none for a runtime exit code, a signal, or an error a peer caused."""
    code = worker.exit_code
    if code is None or code == 0 or code in PEER_FAILURE_EXIT_CODES or code > 128:
        return None
    error = script_error(worker.message)
    if error is None or error.from_peers:
        return None
    return error if before_first_step(worker, health, generation) else None


def before_first_step(worker: WorkerState, health: GroupHealth | None,
                      generation: int) -> bool:
    """No worker reported a step past the one it restored; for a script that reports none,
    the failing trainer ran under UNREPORTED_STARTUP_SECONDS."""
    if health is not None and health.generation == generation and health.ever_reported:
        return not any(t.report.step > t.report.restored_from_step
                       for t in health.workers if t.report is not None)
    if worker.started_at is None or worker.since is None:
        return False
    return worker.since - worker.started_at < timedelta(seconds=UNREPORTED_STARTUP_SECONDS)


def starting_workers(group: ObservedGroup) -> list[WorkerState]:
    """Workers whose start the start-up timeout bounds: not those held in an in-place
    restart's barrier (the old trainer stopping, then the backoff until the release), whose
    own bound is inplace.STOP_BOUND; they are timed from their release (restarted-at)."""
    return [w for w in group.with_phase(WorkerPhase.PENDING, WorkerPhase.STARTING)
            if w.reason not in (STOPPING_OLD_TRAINER, WAITING_FOR_RELEASE)]


def startup_began(group: ObservedGroup, placing_since: datetime | None = None
                  ) -> datetime | None:
    """When the start-up of the group's starting workers began: the earliest of their pods'
    creation (or in-place release), or the first placement of a group placed again."""
    starts = [w.since for w in starting_workers(group) if w.since is not None]
    if placing_since is not None:
        starts.append(placing_since)
    return min(starts, default=None)


def startup_deadline(spec: MultiWorkerJobSpec, group: ObservedGroup,
                     placing_since: datetime | None = None) -> datetime | None:
    """When the earliest starting worker runs out of spec.health.startupTimeoutSeconds."""
    timeout = spec.health.startup_timeout_seconds
    if timeout is None or not starting_workers(group):
        return None
    began = startup_began(group, placing_since)
    return began + timedelta(seconds=timeout) if began is not None else None
