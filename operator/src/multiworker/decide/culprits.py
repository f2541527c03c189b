"""Pure: whom a failure is blamed on, in words. The culprit is the worker that failed *first*;
a worker that exited because a peer went away (runtime exit codes 3 and 4) is blamed only
when nobody else failed. Its description starts every message the failure causes
(`worker-2 exited 137 (OOMKilled)`); policy.py decides what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from multiworker.api.conditions import Reason
from multiworker.api.contract import PEER_FAILURE_EXIT_CODES
from multiworker.decide.hang import Stall
from multiworker.decide.nodes import NodeTrouble
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.workers import EVICTED_FOR_USAGE, WorkerPhase, WorkerState

_UNKNOWN_TIME = datetime.max.replace(tzinfo=UTC)  # failures without a time sort last


@dataclass(frozen=True)
class Culprit:
    """Who or what caused an action: a worker, and what happened to it in words."""

    worker: int
    reason: str  # OOMKilled, Error, Evicted, NodeLost, ProgressStalled, ...
    description: str  # "worker-2 exited 137 (OOMKilled)": the start of every message
    exit_code: int | None = None
    message: str = ""  # details: the last lines of its termination message, the hang
    since: datetime | None = None
    startup_error: str | None = None  # ScriptError.shape of a failure before the first step


def describe(worker: WorkerState) -> str:
    """`worker-2 exited 137 (OOMKilled)`, `worker-1 was evicted (...)`: culprit and cause."""
    who = f"worker-{worker.index}"
    detail = worker.message.strip().splitlines()[-1].rstrip(".") if worker.message.strip() else ""
    if worker.phase is WorkerPhase.DISRUPTED:
        what = {"Deleted": "was deleted", "Evicted": "was evicted", "Preempted": "was preempted",
                "NodeLost": "lost its node", "NodeShutdown": "was stopped by a node shutdown",
                "PodMissing": "disappeared"}.get(worker.reason, f"was disrupted ({worker.reason})")
        return f"{who} {what}" + (f": {detail}" if detail else "")
    if worker.reason == EVICTED_FOR_USAGE:
        return f"{who} was evicted for its own resource usage: {detail}"
    if worker.exit_code is not None:
        cause = f"{worker.reason}: {detail}" if detail else worker.reason
        return f"{who} exited {worker.exit_code} ({cause})"
    return f"{who} failed ({worker.reason}" + (f": {detail})" if detail else ")")


def worker_culprit(worker: WorkerState) -> Culprit:
    return Culprit(worker.index, worker.reason, describe(worker), worker.exit_code,
                   worker.message, worker.since)


def stall_culprit(stall: Stall) -> Culprit:
    """A hung collective: the worker whose progress stopped first."""
    return Culprit(stall.first.index, Reason.PROGRESS_STALLED, stall.describe(),
                   message=stall.describe(), since=stall.stopped_at)


def lost_node_culprit(worker: WorkerState, trouble: NodeTrouble) -> Culprit:
    return Culprit(worker.index, "NodeLost",
                   f"worker-{worker.index} lost its node: {trouble.describe()}",
                   message=trouble.describe(), since=trouble.since)


def is_symptom(worker: WorkerState) -> bool:
    return worker.phase is WorkerPhase.FAILED and worker.exit_code in PEER_FAILURE_EXIT_CODES


def first_failure(failures: list[WorkerState]) -> WorkerState:
    """The worker that failed first; symptoms (peer-failure exits) only as a last resort."""
    def blame_order(w: WorkerState) -> tuple[bool, datetime, bool, int]:
        return is_symptom(w), w.since or _UNKNOWN_TIME, w.phase is not WorkerPhase.DISRUPTED, \
            w.index
    return min(failures, key=blame_order)


def failed_workers(group: ObservedGroup, group_started: bool) -> list[WorkerState]:
    """Failed and disrupted workers; a missing pod counts once the group has been created."""
    failures = group.with_phase(WorkerPhase.FAILED, WorkerPhase.DISRUPTED)
    if group_started:
        failures += [
            WorkerState(w.index, WorkerPhase.DISRUPTED, reason="PodMissing",
                        message="the pod disappeared")
            for w in group.with_phase(WorkerPhase.MISSING)
        ]
    return failures
