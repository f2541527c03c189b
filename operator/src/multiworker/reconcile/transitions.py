"""Status transitions of a pass: what a decision (policy.Action) does to the job's status.

Each transition changes only the in-memory status and queues Events and metrics; commit.py
writes the status once and emits the Events only after that succeeded. `apply` is the one
dispatch from an Action to a transition.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Final, Literal

from multiworker.api import names
from multiworker.api.conditions import Reason, Type
from multiworker.api.spec import RestartMode
from multiworker.api.status import FailureRecord, JobStatus, Phase
from multiworker.clients import metrics
from multiworker.decide import history
from multiworker.decide.inplace import in_place_blocker
from multiworker.decide.policy import Action, ActionKind
from multiworker.decide.progress import last_step_known
from multiworker.decide.startup import startup_began
from multiworker.decide.workers import WorkerPhase
from multiworker.reconcile.context import Pass
from multiworker.reconcile.events import gist, is_problem
from multiworker.reconcile.gang import gang_enabled
from multiworker.reconcile.render import pod_digest

IN_PLACE: Final = "InPlace"
RECREATE: Final = "Recreate"


def apply(p: Pass, action: Action) -> bool:
    """Carry out a decision; whether it ended the pass's decisions (anything but NONE)."""
    kind = action.kind
    if kind is ActionKind.NONE:
        return False
    if kind is ActionKind.WAIT:
        p.wake_in(action.delay_seconds)
    elif kind is ActionKind.FAIL_JOB:
        finish(p, Phase.FAILED, action)
    elif kind is ActionKind.SUCCEED:
        finish(p, Phase.SUCCEEDED, action)
    else:
        restart_group(p, action)
    return True


def restart_group(p: Pass, action: Action) -> None:
    """Move the job to the next generation: the current pods become stale (deleted by the
    next pass) and the new group starts after the backoff."""
    s, counted = p.status, action.kind is ActionKind.RESTART_GROUP
    replacing = action.kind is ActionKind.REPLACE_GROUP  # nothing failed: nothing to count
    if action.culprit is not None:
        s.last_failure = failure_record(p, action)
    last_step = s.last_failure.last_step if action.culprit is not None and s.last_failure \
        else None
    reason = action.culprit.reason if action.culprit else action.reason
    s.history = history.ended(s.history, s.group_generation, reason or action.reason,
                              action.message, p.now, last_step)
    s.group_generation += 1
    s.group_start_time = None
    if counted:
        s.restarts += 1
    elif not replacing:
        s.disruptions += 1
    s.restart_after = p.now + timedelta(seconds=action.delay_seconds) \
        if action.delay_seconds else None
    if not replacing:
        s.recovering_since = s.recovering_since or p.now
    s.placing_since = (s.placing_since or startup_began(p.group) or p.now) if replacing else None
    if action.pin_image is not None:
        s.pinned_image = action.pin_image
    forget_group(s)
    why_not = "the pods' placement must change" if replacing else _why_not_in_place(p)
    s.restart_path = RECREATE if why_not else IN_PLACE
    s.in_place_since = None if why_not else p.now
    s.history = history.began(s.history, s.group_generation, len(p.group.workers),
                              RECREATE if why_not else IN_PLACE, p.now)
    if why_not is None:
        message = f"{action.message}; restarting the group in place"
    elif p.job.spec.restart_policy.mode is RestartMode.RECREATE:
        message = action.message
    else:
        message = f"{action.message}; recreating the group's pods: {why_not}"
    p.condition(Type.RESTARTING, "True", action.reason, message)
    p.emit(action.reason, message)
    p.log.warning("%s", message)
    p.after_write.append(
        lambda: metrics.GROUP_RESTARTS.labels(reason=reason, counted=str(counted).lower()).inc()
    )
    p.wake_in(0)


def _why_not_in_place(p: Pass) -> str | None:
    """Why the group just failed cannot restart in its own pods (decide/inplace.py)."""
    kubelets = {}
    for w in p.group.workers:
        if w.node and w.node not in kubelets:
            node = p.cluster.cached_node(w.node) or {}
            kubelets[w.node] = str(((node.get("status") or {}).get("nodeInfo") or {})
                                   .get("kubeletVersion") or "")
    return in_place_blocker(
        p.job.spec, p.group.workers, pod_digest(p.job, p.status.pinned_image),
        troubles=p.troubles, kubelets=kubelets,
        gang=gang_enabled(p.job.spec, p.options.gang_default))


def abandon_in_place(p: Pass, why: str) -> None:
    """An in-place restart that cannot complete (a pod went, a node failed, the old trainers
    did not all stop in time): the pods become stale and are recreated, as a new generation
    that counts nothing more (the restart was counted when it began)."""
    s = p.status
    message = f"in-place restart abandoned, recreating the group's pods: {why}"
    s.history = history.ended(s.history, s.group_generation, Reason.IN_PLACE_ABANDONED,
                              message, p.now)
    s.group_generation += 1
    s.group_start_time = None
    s.restart_path, s.in_place_since = RECREATE, None
    s.history = history.began(s.history, s.group_generation, len(p.group.workers), RECREATE,
                              p.now)
    forget_group(s)
    p.condition(Type.RESTARTING, "True", Reason.IN_PLACE_ABANDONED, message)
    p.emit(Reason.IN_PLACE_ABANDONED, message)
    p.log.warning("%s", message)
    p.wake_in(0)


def abandon_group(p: Pass, reason: str, message: str) -> None:
    """Give up the current generation without counting anything (its pods could not all be
    created): its pods become stale, and the next attempt starts a fresh generation."""
    p.status.history = history.ended(p.status.history, p.status.group_generation, reason,
                                     message, p.now)
    p.status.group_generation += 1
    p.status.group_start_time = None
    p.status.restart_path, p.status.in_place_since = RECREATE, None
    forget_group(p.status)


def finish(p: Pass, phase: Phase, action: Action) -> None:
    """Succeeded or Failed, for good: the condition says why, the next pass cleans up."""
    s = p.status
    s.completion_time = p.now
    s.restart_after = s.recovering_since = s.blocked_since = s.in_place_since = None
    s.placing_since = None
    s.stragglers = None
    last_step = None
    if phase is Phase.FAILED and action.culprit is not None:
        s.last_failure = failure_record(p, action)
        last_step = s.last_failure.last_step
    s.history = history.ended(s.history, s.group_generation, action.reason, action.message,
                              p.now, last_step)
    if phase is Phase.FAILED:
        p.condition(Type.FAILED, "True", action.reason, action.message)
        p.emit(action.reason, f"job failed: {action.message}")
        p.log.warning("job failed: %s", action.message)
    else:
        p.condition(Type.SUCCEEDED, "True", action.reason, action.message)
        p.emit(action.reason, f"job succeeded: {action.message}")
        p.log.info("job succeeded: %s", action.message)
    p.wake_in(0)  # the next pass cleans the pods up


def forget_group(s: JobStatus) -> None:
    """What described the old group: the next one has not restored or reported anything, and
    none of its pods was refused yet."""
    s.stragglers = None
    s.refused_since = None
    s.bad_progress_reports = 0
    s.in_place_since = None
    if s.progress is not None:
        s.progress = s.progress.model_copy(update={"resumed_from_step": None,
                                                   "resumed_from": None})


def failure_record(p: Pass, action: Action) -> FailureRecord:
    c = action.culprit
    assert c is not None
    reported = p.status.progress.step if p.status.progress is not None else None
    return FailureRecord(
        worker=c.worker, generation=p.group.generation, reason=c.reason or action.reason,
        exit_code=c.exit_code, message=c.message or c.description, time=p.now,
        action=action.kind.value,
        last_step=last_step_known(reported, (w.message for w in p.group.workers)),
        startup_error=c.startup_error,
    )


def not_running(p: Pass, reason: str, message: str) -> None:
    """Running=False with why; a problem gets a Warning Event whenever its gist changes
    (events.gist: not for every count that moves)."""
    old = next((c for c in p.job.status.conditions if c.type == Type.RUNNING), None)
    if is_problem(reason) and (old is None or old.reason != reason
                               or gist(old.message) != gist(message)):
        p.emit(reason, message)
    p.condition(Type.RUNNING, "False", reason, message)


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
    worker = min(waiting, key=lambda w: (not is_problem(w.reason),
                                         w.phase is not WorkerPhase.PENDING, w.index))
    detail = f"{worker.reason}: {worker.message}" if worker.message else worker.reason
    if worker.phase is WorkerPhase.MISSING:
        return Reason.WORKERS_PENDING, f"creating {len(waiting)} workers"
    if worker.phase is WorkerPhase.PENDING:
        unschedulable = worker.reason == Reason.UNSCHEDULABLE
        reason = Reason.UNSCHEDULABLE if unschedulable else Reason.WORKERS_PENDING
        return reason, f"worker-{worker.index} is not scheduled yet ({detail})"
    if is_problem(worker.reason):
        return worker.reason, f"worker-{worker.index} cannot start ({detail})"
    return Reason.WORKERS_STARTING, f"worker-{worker.index} is starting ({detail})"


def group_running(p: Pass) -> None:
    s, old = p.status, p.job.status
    n, generation = len(p.group.workers), s.group_generation
    p.condition(Type.RUNNING, "True", Reason.ALL_WORKERS_RUNNING,
                f"all {n} workers of generation {generation} are running")
    s.history = history.running(s.history, generation, n, p.now)
    how = chief_trainer_start(p)
    if how is not None:
        s.history = history.trainer_started(s.history, generation, how)
    s.placing_since = None
    if s.recovering_since is not None:
        seconds = round((p.now - s.recovering_since).total_seconds(), 3)
        s.last_recovery_seconds, s.recovering_since = seconds, None
        p.emit(Reason.GROUP_RECOVERED,
               f"recovered: all {n} workers of generation {generation} running {seconds:g}s "
               "after the failure")
        p.after_write.append(lambda: metrics.RECOVERY_SECONDS.observe(seconds))
    elif old.phase is not Phase.RUNNING and generation == 0 and p.job.created is not None:
        startup = (p.now - p.job.created).total_seconds()
        p.after_write.append(lambda: metrics.STARTUP_SECONDS.observe(startup))


def chief_trainer_start(p: Pass) -> Literal["warm", "cold"] | None:
    """How the chief's warm launcher started the current generation's trainer, once it said
    (its report on the pod: pod/launcher.py)."""
    chief = next(iter(p.group.workers), None)
    pod = next((pod for pod in p.pods if chief is not None
                and pod["metadata"]["name"] == chief.pod), None)
    raw = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(
        names.ANNOTATION_LAUNCHER)
    try:
        report = json.loads(raw) if raw else {}
    except ValueError:
        return None
    # A held launcher's `path` is its last trainer's: the new one has not started yet.
    if not isinstance(report, dict) or report.get("generation") != p.status.group_generation \
            or report.get("state") not in ("running", "exited"):
        return None
    how = report.get("path")
    return how if how in ("warm", "cold") else None
