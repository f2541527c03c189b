"""Conditions: types, reasons and the one function that sets them.

`set_condition` keeps lastTransitionTime unless the status actually flips, and applies the
exclusion rules: Running and Restarting replace each other; Succeeded, Failed and Suspended
switch Running (and Restarting) off.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from multiworker.api.status import Condition

Status = Literal["True", "False", "Unknown"]
# Every user of a namespace reads its jobs' conditions and Events: a message says what failed,
# why and what happens next in at most this many characters, however large the cluster.
MESSAGE_LIMIT = 1024


class Type(StrEnum):
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PROGRESS_REPORTING = "ProgressReporting"  # can hang detection read the workers?
    STATUS_UNREADABLE = "StatusUnreadable"  # the operator refuses to act on this status
    PEERS_REACHABLE = "PeersReachable"  # can the starting workers reach each other?
    QUEUED = "Queued"  # waiting for Kueue to admit the job (decide/queueing.py)


class Reason(StrEnum):
    """CamelCase reasons, shared by conditions, Events and status.lastFailure."""

    ALL_WORKERS_RUNNING = "AllWorkersRunning"
    WORKERS_PENDING = "WorkersPending"
    WORKERS_STARTING = "WorkersStarting"
    UNSCHEDULABLE = "Unschedulable"
    WORKER_FAILED = "WorkerFailed"
    WORKER_DISRUPTED = "WorkerDisrupted"
    GROUP_RECOVERED = "GroupRecovered"
    RESTART_LIMIT_EXCEEDED = "RestartLimitExceeded"
    REPEATED_STARTUP_ERROR = "RepeatedStartupError"
    EXIT_CODE_FAILS_JOB = "ExitCodeFailsJob"
    STARTUP_TIMEOUT = "StartupTimeout"
    INVALID_SPEC = "InvalidSpec"
    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    CHIEF_SUCCEEDED = "ChiefSucceeded"
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"
    SUSPENDED = "JobSuspended"
    RESUMED = "JobResumed"
    GROUP_CREATED = "GroupCreated"
    OBJECT_CONFLICT = "ObjectConflict"
    JOB_FINISHED = "JobFinished"
    PROGRESS_STALLED = "ProgressStalled"
    STRAGGLER = "Straggler"
    STRAGGLER_RECOVERED = "StragglerRecovered"
    TRAINING_RESUMED = "TrainingResumed"
    EVICTED_FOR_USAGE = "EvictedForResourceUsage"
    DISRUPTION_LIMIT_EXCEEDED = "DisruptionLimitExceeded"
    POD_REFUSED = "PodRefused"
    QUOTA_EXCEEDED = "QuotaExceeded"
    SERVICE_ACCOUNT_MISSING = "ServiceAccountMissing"
    STATUS_UNREADABLE = "StatusUnreadable"
    PROGRESS_REPORTED = "ProgressReported"
    NO_PROGRESS_SERVER = "NoProgressServer"
    BAD_PROGRESS_REPORTS = "BadProgressReports"
    STALE_POD_FORCE_DELETED = "StalePodForceDeleted"
    RECONCILE_ERROR = "ReconcileError"
    PORT_BLOCKED = "PortBlocked"
    IMAGE_SKEW = "ImageSkew"
    WAITING_FOR_GANG = "WaitingForGang"
    GANG_UNAVAILABLE = "GangSchedulingUnavailable"
    NO_GPU_PRODUCT = "NoGpuProductWithRoom"
    PEERS_CONNECTED = "PeersConnected"
    IN_PLACE_ABANDONED = "InPlaceRestartAbandoned"
    IN_PLACE_RELEASED = "InPlaceRestartReleased"
    WARM_STANDBY_OFF = "WarmStandbyOff"  # in place, but the trainers restart cold: why
    AVOIDED_NODE_BACK = "AvoidedNodeBack"
    GPU_PRODUCT_FULL = "GpuProductFull"
    SHRUNK = "Shrunk"  # spec.elastic: the next group is smaller (reconcile/elastic.py)
    GREW = "Grew"
    # Kueue (reconcile/queueing.py)
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    KUEUE_DISABLED = "KueueDisabled"
    KUEUE_NOT_INSTALLED = "KueueNotInstalled"
    WORKLOAD_REFUSED = "WorkloadRefused"
    WORKLOAD_REPLACED = "WorkloadReplaced"


# Setting the key condition to True switches these off (when present and True).
_EXCLUDES: dict[Type, tuple[Type, ...]] = {
    Type.RUNNING: (Type.RESTARTING,),
    Type.RESTARTING: (Type.RUNNING,),
    Type.SUSPENDED: (Type.RUNNING, Type.RESTARTING),
    Type.QUEUED: (Type.RUNNING, Type.RESTARTING),
    Type.SUCCEEDED: (Type.RUNNING, Type.RESTARTING),
    Type.FAILED: (Type.RUNNING, Type.RESTARTING),
}


def find(conditions: list[Condition], type_: Type) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: list[Condition], type_: Type) -> bool:
    found = find(conditions, type_)
    return found is not None and found.status == "True"


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """A condition or Event message cut to `limit` characters, saying that it was cut."""
    cut = " ... (cut here)"
    return message if len(message) <= limit else message[: limit - len(cut)] + cut


def set_condition(
    conditions: list[Condition],
    type_: Type,
    status: Status,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """Return `conditions` with `type_` set; the input list is not changed."""
    result = _upsert(conditions, type_, status, reason, message, now)
    if status == "True":
        for other in _EXCLUDES.get(type_, ()):
            if is_true(result, other):
                result = _upsert(result, other, "False", reason, message, now)
    return result


def _upsert(
    conditions: list[Condition],
    type_: Type,
    status: Status,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    old = find(conditions, type_)
    flipped = old is None or old.status != status
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=bounded(message),
        last_transition_time=now if flipped or old is None else old.last_transition_time,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]
