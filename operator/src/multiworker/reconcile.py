"""One reconcile pass over one job: a flat list of named steps.

observe → stop if finished → delete stale generations → suspend/resume → record progress →
success policy → failure policy → hang policy → create the group (after backoff) → compute
status. The status is patched once, at the end, and Events are emitted only after that write
succeeded. Everything the pass knows comes from the cluster (the job's status and its pods'
labels), so the operator can be killed at any instant and converges when restarted.

Success is checked before failure (unlike JobSet's order): once the chief has finished, its
peers exiting non-zero on their way out must not restart a finished job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from enum import Enum

from multiworker import names
from multiworker.api import CleanPodPolicy
from multiworker.conditions import Reason, Type, find
from multiworker.health import GroupHealth
from multiworker.health_steps import hang_policy, probe_targets, record_progress
from multiworker.job import InvalidJobSpec, Job
from multiworker.k8s import ClusterIO, Conflict, Created, Manifest, RejectedObject
from multiworker.logs import job_logger
from multiworker.observe import PROBLEM_WAITING_REASONS, WorkerPhase, observe_group
from multiworker.policy import Action, ActionKind, failure_action, startup_deadline, success_action
from multiworker.render import owner_reference, render_service, render_worker_pod
from multiworker.status import TERMINAL_PHASES, Phase
from multiworker.transitions import (
    NORMAL,
    WARNING,
    Flow,
    Outcome,
    Pass,
    finish,
    forget_group,
    group_running,
    reject_spec,
    restart_group,
    waiting_for,
    write,
)

# A stale pod still there this long after its deletion deadline is on a lost node: force it.
FORCE_DELETE_AFTER = timedelta(seconds=30)
# Poll while waiting for old pods to go (their deletion events wake us sooner).
STALE_POLL_SECONDS = 2.0
CONFLICT_RETRY_SECONDS = 30.0
# Why-not-running reasons that also get a Warning Event (when the message changes).
_WARN_REASONS = frozenset({Reason.OBJECT_CONFLICT, Reason.UNSCHEDULABLE})


def reconcile(
    cluster: ClusterIO, namespace: str, name: str, now: datetime,
    health: GroupHealth | None = None,
) -> Outcome:
    """One pass; `health` is the workers' progress as last polled (watch.py), if any."""
    body = cluster.get_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome(gone=True)
    try:
        job = Job.from_body(body)
    except InvalidJobSpec as e:
        return reject_spec(cluster, body, e.problems, now)
    status = job.status
    pods = cluster.list_pods(namespace, name)
    group = observe_group(
        pods, job=name, job_uid=job.uid, workers=job.spec.workers,
        generation=status.group_generation, container=job.spec.template.trainer_container(),
    )
    log = job_logger(namespace, name, status.group_generation)
    p = Pass(cluster, body, job, group, now, status.model_copy(deep=True), log, health)
    for step in STEPS:
        if step(p) is Flow.DONE:
            break
    try:
        write(p)
    except Conflict:
        log.debug("the job changed during this pass: reading it again")
        return Outcome(requeue=0)
    return Outcome(requeue=p.requeue, targets=probe_targets(p))


# --- the steps, in order ---


def stop_if_finished(p: Pass) -> Flow:
    """A finished job only cleans its pods up and, after its TTL, deletes itself."""
    if p.job.status.phase not in TERMINAL_PHASES:
        return Flow.CONTINUE
    _clean_finished_pods(p)
    ttl, completed = p.job.spec.ttl_seconds_after_finished, p.status.completion_time
    if ttl is not None and completed is not None:
        deadline = completed + timedelta(seconds=ttl)
        if p.now >= deadline:
            p.log.info("deleting the job: finished %ss ago (ttlSecondsAfterFinished)", ttl)
            p.cluster.delete_job(p.job.namespace, p.job.name, p.job.uid)
            p.deleted = True
        else:
            p.wake_in((deadline - p.now).total_seconds())
    return Flow.DONE


def delete_stale_pods(p: Pass) -> Flow:
    """Pods of an earlier generation go first; their names are reused by the new group.

    A pod of a *later* generation means another pass (an operator replica that has not yet
    noticed it lost its lease, say) moved the job on after this pass read it: the status is
    always written before the pods of a new generation exist, so a fresh read tells.
    """
    if _status_moved_on(p):
        p.outdated = True
        p.wake_in(0)
        return Flow.DONE
    for pod in p.group.stale:
        if pod.deletion is None:
            p.log.info("deleting %s of generation %s", pod.name, pod.generation)
            p.cluster.delete_pod(p.job.namespace, pod.name, pod.uid)
        elif p.now > pod.deletion + FORCE_DELETE_AFTER:
            p.log.warning("force-deleting %s: still there after its grace period", pod.name)
            p.cluster.delete_pod(p.job.namespace, pod.name, pod.uid, grace=0)
    if p.group.stale:
        p.wake_in(STALE_POLL_SECONDS)
    return Flow.CONTINUE


def suspend_or_resume(p: Pass) -> Flow:
    s, suspended = p.status, p.job.status.phase is Phase.SUSPENDED
    if p.job.spec.suspend:
        if not suspended:
            if p.group.has_pods or s.group_start_time is not None:
                s.group_generation += 1  # the running group is now stale: deleted next pass
                forget_group(s)
            s.group_start_time = s.restart_after = s.recovering_since = None
            s.phase = Phase.SUSPENDED
            message = (f"suspended: workers deleted; resuming starts generation "
                       f"{s.group_generation} from the last checkpoint")
            p.condition(Type.SUSPENDED, "True", Reason.SUSPENDED, message)
            p.emit(NORMAL, Reason.SUSPENDED, message)
            p.wake_in(0)
        return Flow.DONE
    if suspended:
        message = f"resumed: starting generation {s.group_generation}"
        p.condition(Type.SUSPENDED, "False", Reason.RESUMED, message)
        p.emit(NORMAL, Reason.RESUMED, message)
        s.phase = Phase.PENDING
    return Flow.CONTINUE


def success_policy(p: Pass) -> Flow:
    action = success_action(p.job.spec, p.group)
    if action.kind is ActionKind.NONE:
        return Flow.CONTINUE
    finish(p, Phase.SUCCEEDED, action)
    return Flow.DONE


def failure_policy(p: Pass) -> Flow:
    action = failure_action(
        p.job.spec, p.status, p.group,
        group_started=p.status.group_start_time is not None, now=p.now,
    )
    if action.kind is ActionKind.NONE:
        return Flow.CONTINUE
    if action.kind is ActionKind.FAIL_JOB:
        finish(p, Phase.FAILED, action)
    else:
        restart_group(p, action)
    return Flow.DONE


def ensure_workers(p: Pass) -> Flow:
    """Create the current group once the old pods are gone and the backoff has passed."""
    s = p.status
    if s.group_start_time is not None or p.group.stale:
        return Flow.CONTINUE
    if s.restart_after is not None and p.now < s.restart_after:
        p.wake_in((s.restart_after - p.now).total_seconds())
        return Flow.CONTINUE
    owner = owner_reference(p.job)
    if not _ensure_service(p, owner):
        return Flow.CONTINUE
    created = 0
    for worker in p.group.with_phase(WorkerPhase.MISSING):
        pod = render_worker_pod(p.job, worker.index, s.group_generation, owner)
        try:
            result = p.cluster.create_pod(pod)
        except RejectedObject as e:
            action = Action(ActionKind.FAIL_JOB, Reason.INVALID_POD_TEMPLATE,
                            f"the API server rejected worker-{worker.index}'s pod: {e}")
            finish(p, Phase.FAILED, action)
            return Flow.DONE
        if result is Created.EXISTS:
            existing = p.cluster.get_pod(p.job.namespace, pod["metadata"]["name"])
            found = _ownership(p, existing, generation=s.group_generation)
            if found is not Owned.OURS:
                _wait_or_conflict(p, found, "pod", pod["metadata"]["name"])
                return Flow.CONTINUE
        created += result is Created.CREATED
    s.group_start_time, s.restart_after = p.now, None
    s.start_time = s.start_time or p.now
    if created:
        p.emit(NORMAL, Reason.GROUP_CREATED,
               f"created {created} workers of generation {s.group_generation}")
    return Flow.CONTINUE


def compute_status(p: Pass) -> Flow:
    """Phase and the Running condition, from the observed group."""
    s, group = p.status, p.group
    if group.all_running and not group.stale:
        group_running(p)
        return Flow.CONTINUE
    reason, message = p.blocked or waiting_for(p)
    old = find(p.job.status.conditions, Type.RUNNING)
    problem = reason in PROBLEM_WAITING_REASONS or reason in _WARN_REASONS
    if problem and (old is None or old.message != message):
        p.emit(WARNING, reason, message)
    p.condition(Type.RUNNING, "False", reason, message)
    if s.recovering_since is not None:
        s.phase = Phase.RESTARTING
    else:
        waiting = group.with_phase(WorkerPhase.PENDING, WorkerPhase.MISSING)
        s.phase = Phase.PENDING if waiting or group.stale else Phase.STARTING
    deadline = startup_deadline(p.job.spec, group)
    if deadline is not None:
        p.wake_in((deadline - p.now).total_seconds())
    return Flow.CONTINUE


STEPS: tuple[Callable[[Pass], Flow], ...] = (
    stop_if_finished,
    delete_stale_pods,
    suspend_or_resume,
    record_progress,
    success_policy,
    failure_policy,
    hang_policy,
    ensure_workers,
    compute_status,
)


# --- helpers of the steps ---


def _status_moved_on(p: Pass) -> bool:
    generation = p.status.group_generation
    if not any(pod.generation is not None and pod.generation > generation
               for pod in p.group.stale):
        return False
    fresh = p.cluster.get_job(p.job.namespace, p.job.name)
    current = ((fresh or {}).get("status") or {}).get("groupGeneration", generation)
    return bool(current != generation)


def _clean_finished_pods(p: Pass) -> None:
    """Delete what spec.cleanPodPolicy says: pods still running, or all of them."""
    everything = p.job.spec.clean_pod_policy is CleanPodPolicy.ALL
    active = (WorkerPhase.RUNNING, WorkerPhase.PENDING, WorkerPhase.STARTING)
    for worker in p.group.workers:
        if worker.terminating or worker.phase is WorkerPhase.MISSING:
            continue
        if everything or worker.phase in active:
            p.cluster.delete_pod(p.job.namespace, worker.pod, worker.uid)
    for pod in p.group.stale:
        if pod.deletion is None:
            p.cluster.delete_pod(p.job.namespace, pod.name, pod.uid)


def _ensure_service(p: Pass, owner: Manifest) -> bool:
    service = render_service(p.job, owner)
    if p.cluster.create_service(service) is Created.CREATED:
        return True
    name = service["metadata"]["name"]
    found = _ownership(p, p.cluster.get_service(p.job.namespace, name), generation=None)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "service", name)
    return False


class Owned(Enum):
    OURS = "ours"
    WAIT = "wait"  # gone meanwhile, or an old pod of ours this pass did not list
    FOREIGN = "foreign"  # another controller's: never touched


def _ownership(p: Pass, obj: Manifest | None, *, generation: int | None) -> Owned:
    """Who controls an object that already existed when we created it."""
    if obj is None:
        return Owned.WAIT
    meta = obj["metadata"]
    controlled = any(r.get("controller") and r.get("uid") == p.job.uid
                     for r in meta.get("ownerReferences", []))
    if not controlled:
        return Owned.FOREIGN
    label = meta.get("labels", {}).get(names.LABEL_GROUP_GENERATION)
    return Owned.OURS if generation is None or label == str(generation) else Owned.WAIT


def _wait_or_conflict(p: Pass, found: Owned, kind: str, name: str) -> None:
    if found is Owned.WAIT:
        p.wake_in(1)
        return
    p.blocked = (Reason.OBJECT_CONFLICT, f"{kind} {name} exists and is not controlled by "
                                         "this job; delete it or rename the job")
    p.wake_in(CONFLICT_RETRY_SECONDS)
