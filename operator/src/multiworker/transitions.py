"""The state of one reconcile pass (Pass) and the status transitions it applies.

Each transition changes only the in-memory status and queues Events and metrics;
`write` patches the status once and emits the queued Events only after that succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from multiworker import metrics
from multiworker.conditions import Reason, Status, Type, set_condition
from multiworker.health import GroupHealth, Targets
from multiworker.job import Job
from multiworker.k8s import ClusterIO, Manifest
from multiworker.logs import JobLogger, job_logger
from multiworker.observe import PROBLEM_WAITING_REASONS, ObservedGroup, WorkerPhase
from multiworker.policy import Action, ActionKind
from multiworker.status import FailureRecord, JobStatus, Phase, parse_status

NORMAL, WARNING = "Normal", "Warning"


class Flow(Enum):
    CONTINUE = "continue"
    DONE = "done"  # skip the remaining steps; the status is still written


@dataclass(frozen=True)
class Outcome:
    requeue: float | None = None  # run again within this many seconds
    gone: bool = False  # the job is gone or being deleted: stop looking after it
    targets: Targets | None = None  # workers to poll for progress until the next pass


@dataclass
class Pass:
    cluster: ClusterIO
    body: Manifest
    job: Job
    group: ObservedGroup
    now: datetime
    status: JobStatus
    log: JobLogger
    health: GroupHealth | None = None  # the workers' progress, as last polled
    events: list[tuple[str, str, str]] = field(default_factory=list)
    after_write: list[Callable[[], None]] = field(default_factory=list)
    requeue: float | None = None
    blocked: tuple[str, str] | None = None  # why the group cannot be created (condition)
    deleted: bool = False  # the job was deleted (ttlSecondsAfterFinished)
    outdated: bool = False  # the status moved on since this pass read it: write nothing

    def wake_in(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def emit(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def condition(self, type_: Type, status: Status, reason: str, message: str) -> None:
        self.status.conditions = set_condition(
            self.status.conditions, type_, status, reason, message, self.now
        )


def restart_group(p: Pass, action: Action) -> None:
    """Move the job to the next generation: the current pods become stale (deleted by the
    next pass) and the new group starts after the backoff (none for disruptions)."""
    s, counted = p.status, action.kind is ActionKind.RESTART_GROUP
    s.last_failure = failure_record(p, action)
    s.group_generation += 1
    s.group_start_time = None
    if counted:
        s.restarts += 1
        s.restart_after = p.now + timedelta(seconds=action.delay_seconds)
    else:
        s.disruptions += 1
        s.restart_after = None
    s.recovering_since = s.recovering_since or p.now
    s.phase = Phase.RESTARTING
    forget_group(s)
    p.condition(Type.RESTARTING, "True", action.reason, action.message)
    p.emit(WARNING, action.reason, action.message)
    p.log.warning("%s", action.message)
    reason = action.culprit.reason if action.culprit else action.reason
    p.after_write.append(
        lambda: metrics.GROUP_RESTARTS.labels(reason=reason, counted=str(counted).lower()).inc()
    )
    p.wake_in(0)


def finish(p: Pass, phase: Phase, action: Action) -> None:
    """Succeeded or Failed, for good: the condition says why, the next pass cleans up."""
    s = p.status
    s.phase, s.completion_time = phase, p.now
    s.restart_after = s.recovering_since = None
    s.stragglers = []
    if phase is Phase.FAILED:
        if action.culprit is not None:
            s.last_failure = failure_record(p, action)
        p.condition(Type.FAILED, "True", action.reason, action.message)
        p.emit(WARNING, action.reason, f"job failed: {action.message}")
        p.log.warning("job failed: %s", action.message)
    else:
        p.condition(Type.SUCCEEDED, "True", action.reason, action.message)
        p.emit(NORMAL, action.reason, f"job succeeded: {action.message}")
        p.log.info("job succeeded: %s", action.message)
    p.wake_in(0)  # the next pass cleans the pods up


def forget_group(s: JobStatus) -> None:
    """What described the old group: the next one has not restored anything yet."""
    s.stragglers = []
    if s.progress is not None:
        s.progress = s.progress.model_copy(update={"resumed_from_step": None})


def failure_record(p: Pass, action: Action) -> FailureRecord:
    worker = action.culprit
    assert worker is not None
    return FailureRecord(
        worker=worker.index, generation=p.group.generation, reason=worker.reason or action.reason,
        exit_code=worker.exit_code, message=worker.message, time=p.now, action=action.kind.value,
    )


def waiting_for(p: Pass) -> tuple[str, str]:
    """Why the group is not running yet, naming one worker that holds it up."""
    s, group = p.status, p.group
    if group.stale:
        return Reason.WORKERS_PENDING, (
            f"waiting for {len(group.stale)} pods of an earlier generation to terminate")
    if s.restart_after is not None and p.now < s.restart_after:
        seconds = int((s.restart_after - p.now).total_seconds())
        return Reason.WORKERS_PENDING, f"restart backoff: the next group starts in {seconds}s"
    waiting = [w for w in group.workers
               if w.phase in (WorkerPhase.PENDING, WorkerPhase.STARTING, WorkerPhase.MISSING)]
    if not waiting:
        return Reason.WORKERS_STARTING, "waiting for workers to start"
    worker = min(waiting, key=lambda w: (w.reason not in PROBLEM_WAITING_REASONS,
                                         w.phase is not WorkerPhase.PENDING, w.index))
    detail = f"{worker.reason}: {worker.message}" if worker.message else worker.reason
    if worker.phase is WorkerPhase.MISSING:
        return Reason.WORKERS_PENDING, f"creating {len(waiting)} workers"
    if worker.phase is WorkerPhase.PENDING:
        unschedulable = worker.reason == Reason.UNSCHEDULABLE
        reason = Reason.UNSCHEDULABLE if unschedulable else Reason.WORKERS_PENDING
        return reason, f"worker-{worker.index} is not scheduled yet ({detail})"
    if worker.reason in PROBLEM_WAITING_REASONS:
        return worker.reason, f"worker-{worker.index} cannot start ({detail})"
    return Reason.WORKERS_STARTING, f"worker-{worker.index} is starting ({detail})"


def group_running(p: Pass) -> None:
    s, old = p.status, p.job.status
    n, generation = len(p.group.workers), s.group_generation
    p.condition(Type.RUNNING, "True", Reason.ALL_WORKERS_RUNNING,
                f"all {n} workers of generation {generation} are running")
    s.phase = Phase.RUNNING
    if s.recovering_since is not None:
        seconds = round((p.now - s.recovering_since).total_seconds(), 3)
        s.last_recovery_seconds, s.recovering_since = seconds, None
        p.emit(NORMAL, Reason.GROUP_RECOVERED,
               f"recovered: all {n} workers of generation {generation} running {seconds:g}s "
               "after the failure")
        p.after_write.append(lambda: metrics.RECOVERY_SECONDS.observe(seconds))
    elif old.phase is not Phase.RUNNING and generation == 0 and p.job.created is not None:
        startup = (p.now - p.job.created).total_seconds()
        p.after_write.append(lambda: metrics.STARTUP_SECONDS.observe(startup))


def dump(status: JobStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True)


def write(p: Pass) -> None:
    """Patch the status once (if it changed), then emit the Events and record metrics."""
    if p.deleted:
        metrics.set_job_phase(p.job.namespace, p.job.name, None)
        return
    if p.outdated:
        return
    s = p.status
    ready = p.group.ready if p.group.generation == s.group_generation else 0
    s.total_workers, s.ready_workers = p.job.spec.workers, ready
    s.ready = f"{ready}/{p.job.spec.workers}"
    s.observed_generation = p.job.generation
    new = dump(s)
    if new != dump(p.job.status):
        p.cluster.patch_job_status(p.job.namespace, p.job.name, new,
                                   p.body["metadata"]["resourceVersion"])
    for type_, reason, message in p.events:
        p.cluster.emit_event(p.body, type_, reason, message, p.now)
    for record in p.after_write:
        record()
    metrics.set_job_phase(p.job.namespace, p.job.name, s.phase)


def reject_spec(cluster: ClusterIO, body: Manifest, problems: list[str], now: datetime) -> Outcome:
    """A spec the CRD let through but the operator cannot run: Failed, once, with every
    problem named — never a crash loop."""
    meta = body["metadata"]
    status = parse_status(body.get("status"))
    if status.phase is Phase.FAILED:
        return Outcome()
    message = "invalid spec: " + "; ".join(problems)
    status.phase, status.completion_time = Phase.FAILED, now
    status.conditions = set_condition(
        status.conditions, Type.FAILED, "True", Reason.INVALID_SPEC, message, now
    )
    cluster.patch_job_status(meta["namespace"], meta["name"], dump(status),
                             meta["resourceVersion"])
    cluster.emit_event(body, WARNING, Reason.INVALID_SPEC, message, now)
    job_logger(meta["namespace"], meta["name"]).warning("%s", message)
    metrics.set_job_phase(meta["namespace"], meta["name"], Phase.FAILED)
    return Outcome()
