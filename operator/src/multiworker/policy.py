"""Pure policies: what to do about the observed group — restart it, fail or finish the job.

No I/O: each function takes the spec, the last status and the observed group, and returns an
Action. The culprit of a failure is the worker that failed *first*; a worker that exited
because a peer went away (runtime exit codes 3 and 4) is blamed only when nobody else failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from multiworker.api import ExitCodeAction, MultiWorkerJobSpec, RestartPolicy, SuccessPolicy
from multiworker.conditions import Reason
from multiworker.observe import ObservedGroup, WorkerPhase, WorkerState, disruption_state
from multiworker.status import JobStatus

# docs/contracts.md: 3 = peers unreachable, 4 = collective aborted. Both are symptoms.
PEER_FAILURE_EXIT_CODES = frozenset({3, 4})
# Waiting reasons that no amount of waiting fixes.
FAIL_AT_ONCE_WAITING_REASONS = frozenset({"InvalidImageName"})
_MAX_DOUBLINGS = 32
_UNKNOWN_TIME = datetime.max.replace(tzinfo=UTC)  # failures without a time sort last


class ActionKind(StrEnum):
    NONE = "None"
    RESTART_GROUP = "RestartGroup"
    RESTART_GROUP_UNCOUNTED = "RestartGroupWithoutCounting"
    FAIL_JOB = "FailJob"
    SUCCEED = "Succeed"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str = ""
    message: str = ""
    culprit: WorkerState | None = None
    delay_seconds: int = 0


NO_ACTION = Action(ActionKind.NONE)


class FailureKind(StrEnum):
    EXIT_CODE = "ExitCode"  # the training container exited non-zero
    POD_FAILED = "PodFailed"  # the pod failed without the trainer exiting (init, kubelet)
    DISRUPTION = "Disruption"  # not the job's fault


def backoff_seconds(policy: RestartPolicy, spent: int) -> int:
    """Delay before restart number `spent + 1`: backoffSeconds doubling, capped."""
    doubled = policy.backoff_seconds * 2 ** min(spent, _MAX_DOUBLINGS)
    return min(policy.max_backoff_seconds, int(doubled))


def describe(worker: WorkerState) -> str:
    """`worker-2 exited 137 (OOMKilled)`, `worker-1 was evicted (...)`: culprit and cause."""
    who = f"worker-{worker.index}"
    if worker.reason == Reason.PROGRESS_STALLED:
        return worker.message  # says it all: which worker stopped first, where, since when
    detail = worker.message.strip().splitlines()[-1].rstrip(".") if worker.message.strip() else ""
    if worker.phase is WorkerPhase.DISRUPTED:
        what = {"Deleted": "was deleted", "Evicted": "was evicted", "Preempted": "was preempted",
                "NodeLost": "lost its node", "NodeShutdown": "was stopped by a node shutdown",
                "PodMissing": "disappeared"}.get(worker.reason, f"was disrupted ({worker.reason})")
        return f"{who} {what}" + (f": {detail}" if detail else "")
    if worker.exit_code is not None:
        cause = f"{worker.reason}: {detail}" if detail else worker.reason
        return f"{who} exited {worker.exit_code} ({cause})"
    return f"{who} failed ({worker.reason}" + (f": {detail})" if detail else ")")


def failure_kind(worker: WorkerState) -> FailureKind:
    if worker.phase is WorkerPhase.DISRUPTED:
        return FailureKind.DISRUPTION
    return FailureKind.EXIT_CODE if worker.exit_code is not None else FailureKind.POD_FAILED


def culprit(failures: list[WorkerState]) -> WorkerState:
    """The worker that failed first; symptoms (peer-failure exits) only as a last resort."""
    def blame_order(w: WorkerState) -> tuple[bool, datetime, bool, int]:
        symptom = w.exit_code in PEER_FAILURE_EXIT_CODES
        return symptom, w.since or _UNKNOWN_TIME, w.phase is not WorkerPhase.DISRUPTED, w.index
    return min(failures, key=blame_order)


def failed_workers(group: ObservedGroup, group_started: bool) -> list[WorkerState]:
    """Failed and disrupted workers; a missing pod counts once the group has been created."""
    failures = group.with_phase(WorkerPhase.FAILED, WorkerPhase.DISRUPTED)
    if group_started:
        failures += [
            disruption_state(w.index, "", "PodMissing", "the pod disappeared", None)
            for w in group.with_phase(WorkerPhase.MISSING)
        ]
    return failures


def failure_action(
    spec: MultiWorkerJobSpec, status: JobStatus, group: ObservedGroup, *,
    group_started: bool, now: datetime,
) -> Action:
    """Restart the group, fail the job, or nothing — for failures and stuck starts."""
    failures = failed_workers(group, group_started)
    if not failures:
        return startup_action(spec, group, now)
    worker = culprit(failures)
    return _FAILURE_HANDLERS[failure_kind(worker)](spec, status, worker)


def _on_exit_code(spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState) -> Action:
    assert worker.exit_code is not None
    if spec.restart_policy.action_for(worker.exit_code) is ExitCodeAction.FAIL_JOB:
        return Action(
            ActionKind.FAIL_JOB, Reason.EXIT_CODE_FAILS_JOB,
            f"{describe(worker)}; exit code {worker.exit_code} fails the job "
            "(spec.restartPolicy)", worker,
        )
    return _counted_restart(spec, status, worker)


def _on_pod_failure(spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState) -> Action:
    return _counted_restart(spec, status, worker)


def _on_disruption(spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState) -> Action:
    left = max(spec.restart_policy.max_restarts - status.restarts, 0)
    return Action(
        ActionKind.RESTART_GROUP_UNCOUNTED, Reason.WORKER_DISRUPTED,
        f"restarting group: {describe(worker)}; a disruption, not counted as a restart "
        f"({left} of {spec.restart_policy.max_restarts} left); starting now", worker,
    )


def stall_action(spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState) -> Action:
    """A hung collective (health.find_stall) is a failure: restart the group, spending one
    restart; `worker` stopped first, its message says where and since when."""
    return _counted_restart(spec, status, worker, Reason.PROGRESS_STALLED)


def _counted_restart(
    spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState,
    reason: str = Reason.WORKER_FAILED,
) -> Action:
    policy = spec.restart_policy
    if status.restarts >= policy.max_restarts:
        return Action(
            ActionKind.FAIL_JOB, Reason.RESTART_LIMIT_EXCEEDED,
            f"{describe(worker)}; restart limit reached ({status.restarts} of "
            f"{policy.max_restarts} restarts spent)", worker,
        )
    delay = backoff_seconds(policy, status.restarts)
    when = f"in {delay}s" if delay else "now"
    return Action(
        ActionKind.RESTART_GROUP, reason,
        f"restarting group: {describe(worker)}; restart {status.restarts + 1} of "
        f"{policy.max_restarts} {when}", worker, delay,
    )


_FAILURE_HANDLERS: dict[FailureKind, Callable[[MultiWorkerJobSpec, JobStatus, WorkerState],
                                              Action]] = {
    FailureKind.EXIT_CODE: _on_exit_code,
    FailureKind.POD_FAILED: _on_pod_failure,
    FailureKind.DISRUPTION: _on_disruption,
}


def startup_action(spec: MultiWorkerJobSpec, group: ObservedGroup, now: datetime) -> Action:
    """Fail the job when a worker cannot start: at once for what waiting cannot fix, else
    after spec.health.startupTimeoutSeconds."""
    timeout = spec.health.startup_timeout_seconds
    for worker in group.with_phase(WorkerPhase.PENDING, WorkerPhase.STARTING):
        overdue = (
            timeout is not None and worker.since is not None
            and now - worker.since >= timedelta(seconds=timeout)
        )
        if worker.reason in FAIL_AT_ONCE_WAITING_REASONS or overdue:
            within = f"within {timeout}s" if overdue else "and waiting will not help"
            detail = f": {worker.message}" if worker.message else ""
            return Action(
                ActionKind.FAIL_JOB, Reason.STARTUP_TIMEOUT,
                f"worker-{worker.index} could not start {within} ({worker.reason}{detail})",
                worker,
            )
    return NO_ACTION


def startup_deadline(spec: MultiWorkerJobSpec, group: ObservedGroup) -> datetime | None:
    """When the earliest starting worker runs out of spec.health.startupTimeoutSeconds."""
    timeout = spec.health.startup_timeout_seconds
    starts = [
        w.since for w in group.with_phase(WorkerPhase.PENDING, WorkerPhase.STARTING)
        if w.since is not None
    ]
    if timeout is None or not starts:
        return None
    return min(starts) + timedelta(seconds=timeout)


def _chief_succeeded(group: ObservedGroup) -> Action:
    if group.workers[0].phase is WorkerPhase.SUCCEEDED:
        return Action(ActionKind.SUCCEED, Reason.CHIEF_SUCCEEDED, "worker-0 (the chief) exited 0")
    return NO_ACTION


def _all_succeeded(group: ObservedGroup) -> Action:
    if all(w.phase is WorkerPhase.SUCCEEDED for w in group.workers):
        return Action(ActionKind.SUCCEED, Reason.ALL_WORKERS_SUCCEEDED,
                      f"all {len(group.workers)} workers exited 0")
    return NO_ACTION


_SUCCESS_CHECKS: dict[SuccessPolicy, Callable[[ObservedGroup], Action]] = {
    SuccessPolicy.CHIEF_SUCCEEDED: _chief_succeeded,
    SuccessPolicy.ALL_WORKERS_SUCCEEDED: _all_succeeded,
}


def success_action(spec: MultiWorkerJobSpec, group: ObservedGroup) -> Action:
    """Succeed per spec.successPolicy. Checked before failures: once the chief is done, its
    peers exiting non-zero on the way out must not restart a finished job."""
    return _SUCCESS_CHECKS[spec.success_policy](group)
