"""One reconcile pass over one job: a flat list of named steps.

stop if finished → delete stale generations → suspend/resume → record progress → success
policy → failure policy (failures, lost nodes, stuck starts) → hang policy → create the group
→ Running condition. The status is written once, at the end (commit.py), and Events only after
that write succeeded. A pass reads the job, its pods and nodes from the watch-fed caches and
decides from them alone, so the operator can be killed at any instant and converges when
restarted.

Success is checked before failure (unlike JobSet's order): once the chief has finished, its
peers exiting non-zero on their way out must not restart a finished job.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from multiworker.api import CleanPodPolicy
from multiworker.commit import commit, emit, write
from multiworker.conditions import Reason, Type, find, set_condition
from multiworker.context import ClusterIO, Flow, Outcome, Pass
from multiworker.events import event_type
from multiworker.gpus import gpus_per_worker, place
from multiworker.hang import find_stall
from multiworker.job import InvalidJobSpec, Job
from multiworker.k8s import Conflict, Created, Gone, PodDeletion, RefusalKind, Refused
from multiworker.logs import job_logger
from multiworker.nodes import NodeTrouble, node_trouble
from multiworker.observe import WorkerPhase, observe_group
from multiworker.ownership import Owned, controlled_by, ownership
from multiworker.policy import (
    Action,
    ActionKind,
    failure_action,
    hang_action,
    lost_node_deadline,
    refused_start_action,
    startup_deadline,
    success_action,
)
from multiworker.progress import GroupHealth
from multiworker.render import owner_reference, render_service, render_worker_pod
from multiworker.reporting import current_health, poll_targets, record_progress
from multiworker.status import TERMINAL_PHASES, JobStatus, Phase, UnreadableStatus, parse_status
from multiworker.transitions import (
    abandon_group,
    apply,
    finish,
    forget_group,
    group_running,
    not_running,
    waiting_for,
)

Manifest = dict[str, Any]

# A stale pod still there this long after its deletion deadline may be force-deleted — but
# only if its node is gone or unreachable (else its kubelet is still stopping it).
FORCE_DELETE_AFTER = timedelta(seconds=30)
CONFLICT_RETRY_SECONDS = 30.0


def reconcile(
    cluster: ClusterIO, namespace: str, name: str, now: datetime,
    health: GroupHealth | None = None, expected: Collection[str] = (),
) -> Outcome:
    """One pass; `health` is the workers' progress as last polled (poller.py), `expected`
    the pods this operator created that the cache has not shown yet."""
    body = cluster.cached_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome(gone=True)
    try:
        job = Job.from_body(body)
    except UnreadableStatus as e:
        return refuse_unreadable_status(cluster, body, e.problems, now)
    except InvalidJobSpec as e:
        return fail_invalid_spec(cluster, body, e.problems, now)
    status = job.status
    pods = cluster.cached_pods(namespace, name)
    group = observe_group(
        pods, job=name, job_uid=job.uid, workers=job.spec.workers,
        generation=status.group_generation, container=job.spec.template.trainer_container(),
        expected=expected,
    )
    troubles = _troubles(cluster, {w.node for w in group.workers} | {s.node for s in group.stale})
    log = job_logger(namespace, name, status.group_generation)
    p = Pass(cluster, body, job, group, troubles, now, status.model_copy(deep=True), log,
             health)
    for step in STEPS:
        if step(p) is Flow.DONE:
            break
    try:
        written = commit(p)
    except Conflict:
        log.debug("the job changed during this pass: reading it again")
        return Outcome(requeue=0)
    except Gone:
        return Outcome(gone=True)
    read = str(body["metadata"].get("resourceVersion", ""))
    return Outcome(requeue=p.requeue, targets=poll_targets(p), created=tuple(p.created),
                   written=(read, written) if written is not None else None)


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
            p.wake_at(deadline)
    return Flow.DONE


def delete_stale_pods(p: Pass) -> Flow:
    """Pods of an earlier generation go first; their names are reused by the new group.

    A pod of a *later* generation means another instance moved the job on after this pass
    read it (the status is written before the pods of a new generation exist): write nothing.
    A stale pod that outlives its grace period is force-deleted only when its node is gone or
    unreachable — a live kubelet is still stopping it, and the old chief may still be writing
    its checkpoint.
    """
    if any(pod.generation is not None and pod.generation > p.status.group_generation
           for pod in p.group.stale):
        p.outdated = True
        p.wake_in(1)
        return Flow.DONE
    ns, deletions = p.job.namespace, []
    for pod in p.group.stale:
        if pod.deletion is None:
            p.log.info("deleting %s of generation %s", pod.name, pod.generation)
            deletions.append(PodDeletion(ns, pod.name, pod.uid))
            continue
        due = pod.deletion + FORCE_DELETE_AFTER
        trouble = p.troubles.get(pod.node)
        if trouble is None or p.now < due:
            p.wake_at(due if trouble is not None else None)
            continue
        message = (f"force-deleting {pod.name} of generation {pod.generation}: its grace "
                   f"period ended and {trouble.describe()}, so no kubelet will stop it")
        p.log.warning("%s", message)
        p.emit(Reason.STALE_POD_FORCE_DELETED, message)
        deletions.append(PodDeletion(ns, pod.name, pod.uid, grace=0))
    p.cluster.delete_pods(deletions)
    return Flow.CONTINUE


def suspend_or_resume(p: Pass) -> Flow:
    s, suspended = p.status, p.job.status.phase is Phase.SUSPENDED
    if p.job.spec.suspend:
        if not suspended:
            if p.group.has_pods or s.group_start_time is not None:
                s.group_generation += 1  # the running group is now stale: deleted next pass
                forget_group(s)
            s.group_start_time = s.restart_after = s.recovering_since = None
            s.blocked_since = None
            message = (f"suspended: workers deleted; resuming starts generation "
                       f"{s.group_generation} from the last checkpoint")
            p.condition(Type.SUSPENDED, "True", Reason.SUSPENDED, message)
            p.emit(Reason.SUSPENDED, message)
            p.wake_in(0)
        return Flow.DONE
    if suspended:
        message = f"resumed: starting generation {s.group_generation}"
        p.condition(Type.SUSPENDED, "False", Reason.RESUMED, message)
        p.emit(Reason.RESUMED, message)
    return Flow.CONTINUE


def success_policy(p: Pass) -> Flow:
    return Flow.DONE if apply(p, success_action(p.job.spec, p.group)) else Flow.CONTINUE


def failure_policy(p: Pass) -> Flow:
    action = failure_action(
        p.job.spec, p.status, p.group, group_started=p.status.group_start_time is not None,
        now=p.now, troubles=p.troubles,
    )
    if action.kind is ActionKind.NONE:
        p.wake_at(lost_node_deadline(p.job.spec, p.group, p.troubles))
        return Flow.CONTINUE
    apply(p, action)
    return Flow.DONE if action.kind is not ActionKind.WAIT else Flow.CONTINUE


def hang_policy(p: Pass) -> Flow:
    """Restart the group (spending a restart) when no worker advanced for
    spec.health.progressTimeoutSeconds (hang.py); the worker that stopped first is blamed."""
    if not p.group.all_running or p.group.stale:
        return Flow.CONTINUE
    stall = find_stall(current_health(p), p.job.spec.health.progress_timeout_seconds)
    return Flow.DONE if apply(p, hang_action(p.job.spec, p.status, stall)) else Flow.CONTINUE


def ensure_workers(p: Pass) -> Flow:
    """Create the current group, all pods at once, once the old pods are gone and the
    backoff has passed. A refused pod fails the job, or (quota) retries the whole group."""
    s = p.status
    if s.group_start_time is not None or p.group.stale:
        return Flow.CONTINUE
    if s.restart_after is not None and p.now < s.restart_after:
        p.wake_at(s.restart_after)
        return Flow.CONTINUE
    missing = p.group.with_phase(WorkerPhase.MISSING)
    if not p.group.has_pods and not _place_group(p):
        return Flow.CONTINUE if p.status.completion_time is None else Flow.DONE
    owner = owner_reference(p.job)
    if not _ensure_service(p, owner):
        return Flow.CONTINUE
    pods = [render_worker_pod(p.job, w.index, s.group_generation, owner,
                              image=s.pinned_image, gpu_product=s.gpu_product)
            for w in missing]
    results = p.cluster.create_pods(pods)
    refused = next(((w.index, r) for w, r in zip(missing, results, strict=True)
                    if isinstance(r, Refused)), None)
    if refused is not None:
        return _refused(p, *refused, created=any(r is Created.CREATED for r in results))
    for pod, result in zip(pods, results, strict=True):
        if result is Created.EXISTS:
            pod_name = pod["metadata"]["name"]
            found = ownership(p.cluster.get_pod(p.job.namespace, pod_name), p.job.uid,
                              generation=s.group_generation)
            if found is not Owned.OURS:
                _wait_or_conflict(p, found, "pod", pod_name)
                return Flow.CONTINUE
    s.group_start_time, s.restart_after, s.blocked_since = p.now, None, None
    s.start_time = s.start_time or p.now
    p.created = [pod["metadata"]["name"] for pod, r in zip(pods, results, strict=True)
                 if r is Created.CREATED]
    created = len(p.created)
    if created:
        p.emit(Reason.GROUP_CREATED,
               f"created {created} workers of generation {s.group_generation}")
    return Flow.CONTINUE


def compute_status(p: Pass) -> Flow:
    """The Running condition from the observed group (the phase follows in commit.py)."""
    group = p.group
    if group.all_running and not group.stale:
        group_running(p)
        return Flow.CONTINUE
    reason, message = p.blocked or _still_refused(p) or waiting_for(p)
    not_running(p, reason, message)
    p.wake_at(startup_deadline(p.job.spec, group))
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


# --- jobs the steps cannot run on ---


def refuse_unreadable_status(cluster: ClusterIO, body: Manifest, problems: list[str],
                             now: datetime) -> Outcome:
    """Never act on a status we cannot read: no pod is created or deleted, nothing is reset.
    Only the StatusUnreadable condition (and one Event) say why."""
    meta = body["metadata"]
    message = ("the operator cannot read this job's status and will not act on it until it "
               "is fixed (pods are kept): " + "; ".join(problems)[:800])
    raw = (body.get("status") or {}).get("conditions")
    try:
        conditions = JobStatus.model_validate({"conditions": raw or []}).conditions
    except ValueError:
        conditions = []
    old = find(conditions, Type.STATUS_UNREADABLE)
    if old is not None and old.message == message and old.status == "True":
        return Outcome()
    conditions = set_condition(conditions, Type.STATUS_UNREADABLE, "True",
                               Reason.STATUS_UNREADABLE, message, now)
    fields = {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conditions]}
    try:
        write(cluster, body, fields)
    except Conflict:
        return Outcome(requeue=0)
    emit(cluster, body, [(event_type(Reason.STATUS_UNREADABLE), Reason.STATUS_UNREADABLE,
                          message)], now)
    job_logger(meta["namespace"], meta["name"]).error("%s", message)
    return Outcome()


def fail_invalid_spec(cluster: ClusterIO, body: Manifest, problems: list[str],
                      now: datetime) -> Outcome:
    """A spec the CRD let through but the operator cannot run (or one changed while the job
    ran): delete its pods — they hold GPUs — and fail, once, with every problem named."""
    meta = body["metadata"]
    uid = meta.get("uid", "")
    doomed = [PodDeletion(meta["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"])
              for pod in cluster.cached_pods(meta["namespace"], meta["name"])
              if controlled_by(pod["metadata"], uid)
              and not pod["metadata"].get("deletionTimestamp")]
    cluster.delete_pods(doomed)
    status = parse_status(body.get("status"))
    if find(status.conditions, Type.FAILED) is not None and status.phase is Phase.FAILED:
        return Outcome()
    message = "invalid spec: " + "; ".join(problems)
    status.phase, status.completion_time = Phase.FAILED, now
    status.restart_after = status.recovering_since = status.blocked_since = None
    status.conditions = set_condition(status.conditions, Type.FAILED, "True",
                                      Reason.INVALID_SPEC, message, now)
    try:
        write(cluster, body, status.model_dump(mode="json", by_alias=True))
    except Conflict:
        return Outcome(requeue=0)
    emit(cluster, body, [(event_type(Reason.INVALID_SPEC), Reason.INVALID_SPEC, message)], now)
    job_logger(meta["namespace"], meta["name"]).warning("%s", message)
    return Outcome()


# --- helpers of the steps ---


def _troubles(cluster: ClusterIO, node_names: set[str]) -> dict[str, NodeTrouble]:
    found = {}
    for node in node_names - {""}:
        trouble = node_trouble(node, cluster.cached_node(node))
        if trouble is not None:
            found[node] = trouble
    return found


def _clean_finished_pods(p: Pass) -> None:
    """Delete what spec.cleanPodPolicy says: pods still running, or all of them."""
    everything = p.job.spec.clean_pod_policy is CleanPodPolicy.ALL
    active = (WorkerPhase.RUNNING, WorkerPhase.PENDING, WorkerPhase.STARTING)
    ns = p.job.namespace
    deletions = [PodDeletion(ns, w.pod, w.uid) for w in p.group.workers
                 if not w.terminating and w.phase is not WorkerPhase.MISSING and w.uid
                 and (everything or w.phase in active)]
    deletions += [PodDeletion(ns, pod.name, pod.uid) for pod in p.group.stale
                  if pod.deletion is None]
    p.cluster.delete_pods(deletions)


def _refused(p: Pass, worker: int, refusal: Refused, created: bool) -> Flow:
    action = refused_start_action(p.job.spec, p.status, p.now, refusal.message,
                                  quota=refusal.kind is RefusalKind.QUOTA, worker=worker)
    if refusal.kind is RefusalKind.INVALID:
        action = Action(ActionKind.FAIL_JOB, Reason.INVALID_POD_TEMPLATE,
                        f"the API server rejected worker-{worker}'s pod: {refusal.message}")
    if action.kind is ActionKind.FAIL_JOB:
        finish(p, Phase.FAILED, action)
        return Flow.DONE
    if created or p.group.has_pods:
        abandon_group(p)  # no partial group waits for peers that will never come
    s = p.status
    s.blocked_since = s.blocked_since or p.now
    s.restart_after = p.now + timedelta(seconds=action.delay_seconds)
    p.blocked = (Reason.QUOTA_EXCEEDED, action.message)
    p.wake_in(action.delay_seconds)
    return Flow.CONTINUE


def _still_refused(p: Pass) -> tuple[str, str] | None:
    """While waiting to retry a group the quota refused, keep saying so."""
    if p.status.blocked_since is None:
        return None
    old = find(p.job.status.conditions, Type.RUNNING)
    if old is not None and old.reason in (Reason.QUOTA_EXCEEDED, Reason.NO_GPU_PRODUCT):
        return old.reason, old.message
    return None


def _place_group(p: Pass) -> bool:
    """Choose the GPU product of a new group (gpus.py); False, with the reason in status,
    when no single product can hold it — after spec.health.startupTimeoutSeconds, Failed."""
    s, spec = p.status, p.job.spec
    placement = place(p.cluster.cached_nodes(), spec.workers,
                      gpus_per_worker(spec.template.as_dict()), spec.gpu_product)
    if placement.problem is None:
        s.gpu_product = placement.product
        return True
    since = s.blocked_since or p.now
    waited = (p.now - since).total_seconds()
    timeout = spec.health.startup_timeout_seconds
    if timeout is not None and waited >= timeout:
        finish(p, Phase.FAILED, Action(ActionKind.FAIL_JOB, Reason.STARTUP_TIMEOUT,
                                       f"{placement.problem} for {waited:.0f}s "
                                       "(spec.health.startupTimeoutSeconds)"))
        return False
    s.blocked_since = since
    p.blocked = (Reason.NO_GPU_PRODUCT, placement.problem)
    p.wake_in(min(30.0, timeout - waited) if timeout is not None else 30.0)
    return False


def _ensure_service(p: Pass, owner: Manifest) -> bool:
    service = render_service(p.job, owner)
    try:
        if p.cluster.create_service(service) is Created.CREATED:
            return True
    except Refused as e:
        finish(p, Phase.FAILED, Action(ActionKind.FAIL_JOB, Reason.POD_REFUSED,
                                       f"the API server refused the job's Service: {e.message}"))
        return False
    name = service["metadata"]["name"]
    found = ownership(p.cluster.get_service(p.job.namespace, name), p.job.uid, generation=None)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "service", name)
    return False


def _wait_or_conflict(p: Pass, found: Owned, kind: str, name: str) -> None:
    if found is Owned.WAIT:
        p.wake_in(1)
        return
    p.blocked = (Reason.OBJECT_CONFLICT, f"{kind} {name} exists and is not controlled by "
                                         "this job; delete it or rename the job")
    p.wake_in(CONFLICT_RETRY_SECONDS)
