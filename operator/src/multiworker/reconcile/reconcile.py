"""One reconcile pass over one job: a flat list of named steps.

stop if finished → delete stale generations (or, restarting in place, move them to the
new one) → release an in-place restart → remember trainer exits (in place: inplace.py) →
Kueue's admission (queueing.py) → suspend/resume → record progress → success policy →
failure policy (failures, image skew, lost nodes: troubles.py, stuck starts) → hang policy →
create the group (creation.py) → Running condition. Jobs the steps
cannot run on — an unreadable status, an invalid spec — are unrunnable.py's. The status is
written once, at the end (commit.py), and Events only after
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

from multiworker.api.conditions import Reason, Type
from multiworker.api.job import InvalidJobSpec, Job
from multiworker.api.spec import CleanPodPolicy
from multiworker.api.status import TERMINAL_PHASES, Phase, UnreadableStatus, parse_status
from multiworker.clients.agents import AgentNote, signed
from multiworker.clients.writes import Conflict, GenerationDeletion, Gone, PodDeletion
from multiworker.decide import history
from multiworker.decide.fit import may_host
from multiworker.decide.gpus import (
    GPU_RESOURCE,
    GpuRequestError,
    free_room,
    gpus_per_worker,
    held_gpus,
)
from multiworker.decide.hang import find_stall
from multiworker.decide.lost_nodes import lost_node_deadline, lost_nodes, node_lost, node_lost_at
from multiworker.decide.nodes import (
    NodeTrouble,
)
from multiworker.decide.observe import Classified, StalePod, observe_group
from multiworker.decide.policy import (
    NO_ACTION,
    Action,
    ActionKind,
    broken_group_grace,
    failure_action,
    hang_action,
    product_full_action,
    replacement_action,
    success_action,
    survivor_save_grace,
)
from multiworker.decide.progress import GroupHealth
from multiworker.decide.startup import startup_deadline
from multiworker.decide.workers import WorkerPhase
from multiworker.logs import job_logger
from multiworker.reconcile.agent_keys import agent_key
from multiworker.reconcile.commit import commit
from multiworker.reconcile.context import ClusterIO, Flow, Options, Outcome, Pass
from multiworker.reconcile.creation import (
    ensure_workers,
    still_blocked,
    usable_nodes,
    why_not_placed,
)
from multiworker.reconcile.elastic import resize_policy
from multiworker.reconcile.gang import pod_group_path
from multiworker.reconcile.inplace import move_in_place, release_in_place, remember_exits
from multiworker.reconcile.queueing import admit_through_queue, finish_workload
from multiworker.reconcile.render import owner_reference, render_worker_pod
from multiworker.reconcile.reporting import current_health, poll_targets, record_progress
from multiworker.reconcile.transitions import (
    apply,
    forget_group,
    group_running,
    not_running,
    waiting_for,
)
from multiworker.reconcile.troubles import node_troubles, renewals_of, reread_troubles
from multiworker.reconcile.unrunnable import fail_invalid_spec, refuse_unreadable_status

Manifest = dict[str, Any]
CONFLICT_RETRY_SECONDS = 1.0
DEFAULT_GRACE_SECONDS = 30  # a pod's terminationGracePeriodSeconds when its spec sets none
DEFAULT_OPTIONS = Options()

# A stale pod still there this long after its deletion deadline may be force-deleted — but
# only if its node is gone or unreachable (else its kubelet is still stopping it).
FORCE_DELETE_AFTER = timedelta(seconds=30)


def reconcile(
    cluster: ClusterIO, namespace: str, name: str, now: datetime,
    health: GroupHealth | None = None, expected: Collection[str] = (),
    options: Options = DEFAULT_OPTIONS, classified: Classified | None = None,
    last_write: datetime | None = None,
) -> Outcome:
    """One pass; `health` is the workers' progress as last polled (poller.py), `expected`
    the pods this operator created that the cache has not shown yet, `options` the
    operator's command-line choices, `classified` the job's pod states from earlier passes
    (observe.Classified), `last_write` when this operator last wrote its status."""
    body = cluster.cached_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome(gone=True)
    try:
        job = Job.from_body(body)
    except UnreadableStatus as e:
        return refuse_unreadable_status(cluster, body, e.problems, now)
    except InvalidJobSpec as e:
        return fail_invalid_spec(cluster, body, e.problems, now)
    job = job.sized()
    status = job.status
    pods = cluster.cached_pods(namespace, name)
    group = observe_group(
        pods, job=name, job_uid=job.uid, workers=job.spec.workers,
        generation=status.group_generation, container=job.spec.template.trainer_container(),
        expected=expected, classified=classified, now=now,
    )
    troubles = node_troubles(
        cluster, {w.node for w in group.workers} | {s.node for s in group.stale}, now)
    log = job_logger(namespace, name, status.group_generation)
    # The status this pass changes: parsed again, a tenth of what a deep copy costs.
    p = Pass(cluster, body, job, group, troubles, now, parse_status(body.get("status")), log,
             health, pods=pods, options=options, last_write=last_write)
    for step in STEPS:
        if step(p) is Flow.DONE:
            break
    try:
        written = commit(p)
    except Conflict:
        # Its watch event wakes the job again; this is the fallback if the cache lags, never
        # a loop of 409s at full speed.
        log.debug("the job changed during this pass: reading it again")
        return Outcome(requeue=CONFLICT_RETRY_SECONDS, agent_notes=_signed_notes(p))
    except Gone:
        return Outcome(gone=True)
    read = str(body["metadata"].get("resourceVersion", ""))
    return Outcome(requeue=p.requeue, targets=poll_targets(p), created=tuple(p.created),
                   written=(read, written) if written is not None else None,
                   agent_notes=_signed_notes(p))


def _signed_notes(p: Pass) -> tuple[AgentNote, ...]:
    return tuple(signed(p.agent_notes, agent_key(p))) if p.agent_notes else ()


# --- the steps, in order ---


def stop_if_finished(p: Pass) -> Flow:
    """A finished job only cleans its pods up and, after its TTL, deletes itself."""
    if p.job.status.phase not in TERMINAL_PHASES:
        return Flow.CONTINUE
    _clean_finished_pods(p)
    finish_workload(p)
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
    its checkpoint. On a node already lost (nodeLostSeconds of trouble), a job whose workers
    run the multiworker runtime (they reported progress) with checkpoints does not wait out
    the grace period: no kubelet there will stop the pod, and the runtime's fence keeps a
    trainer that still runs (a partitioned node) from saving once the new group claims the
    directory (docs/contracts.md).
    """
    if any(pod.generation is not None and pod.generation > p.status.group_generation
           for pod in p.group.stale):
        p.outdated = True
        p.wake_in(1)
        return Flow.DONE
    ns, deletions = p.job.namespace, []
    stale = move_in_place(p)
    progress = p.status.progress
    fenced = p.job.spec.checkpoint is not None and progress is not None
    own_grace = (p.job.spec.template.spec.model_extra or {}).get(
        "terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    survivor_save = survivor_save_grace(
        progress.expected_save_seconds, progress.steps_per_second,
        p.job.spec.restart_policy.survivor_save_seconds) \
        if fenced and progress is not None else None
    doomed: dict[tuple[int | None, int | None], list[StalePod]] = {}  # (generation, grace)
    for pod in stale:
        if pod.deletion is None:
            grace = broken_group_grace(p.status.last_failure, pod.generation, own_grace,
                                       survivor_save)
            doomed.setdefault((pod.generation, grace), []).append(pod)
            continue
        due = pod.deletion + FORCE_DELETE_AFTER
        trouble = p.troubles.get(pod.node)
        def at_once(trouble: NodeTrouble | None) -> bool:
            return fenced and trouble is not None and node_lost(p.job.spec, trouble, p.now)
        if trouble is not None and (p.now >= due or at_once(trouble)):
            trouble = reread_troubles(p, {pod.node}).get(pod.node)
        if trouble is None or (p.now < due and not at_once(trouble)):
            if trouble is not None:
                # A node lost since the group restarted (the restart may come sooner: a
                # symptom, a silent Lease) lets a fenced pod go then, not at `due`.
                lost_at = node_lost_at(p.job.spec, trouble) if fenced else None
                p.wake_at(min(due, lost_at) if lost_at is not None else due)
            continue
        why = ("its node is lost and the job's checkpoints are fenced" if p.now < due
               else "its grace period ended")
        message = (f"force-deleting {pod.name} of generation {pod.generation}: {why}, and "
                   f"{trouble.describe()}, so no kubelet will stop it")
        p.log.warning("%s", message)
        p.emit(Reason.STALE_POD_FORCE_DELETED, message)
        deletions.append(PodDeletion(ns, pod.name, pod.uid, grace=0))
    for (generation, grace), pods in doomed.items():
        deletions += _delete_generation(p, generation, grace, pods)
    p.cluster.delete_pods(deletions)
    # A gang's PodGroup (one per generation, gang.py) goes with its pods, once.
    for pod_group in sorted({pod.pod_group for pod in p.group.stale
                             if pod.pod_group and pod.deletion is None}):
        p.cluster.delete_object(pod_group_path(ns, pod_group))
    return Flow.CONTINUE


def suspend_or_resume(p: Pass) -> Flow:
    s, suspended = p.status, p.job.status.phase is Phase.SUSPENDED
    if p.job.spec.suspend:
        if not suspended:
            stopped = p.group.has_pods or s.group_start_time is not None
            if stopped:
                s.group_generation += 1  # the running group is now stale: deleted next pass
                forget_group(s)
            message = (f"suspended: workers deleted; resuming starts generation "
                       f"{s.group_generation} from the last checkpoint")
            if stopped:
                s.history = history.ended(s.history, s.group_generation - 1,
                                          Reason.SUSPENDED, message, p.now)
            s.group_start_time = s.restart_after = s.recovering_since = None
            s.blocked_since = None
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
    """Failed workers, lost nodes and stuck starts (policy.failure_action). A node is lost
    only as read from the API just now: the watch may still show trouble that has ended."""
    lost = lost_nodes(p.job.spec, p.group, p.troubles, p.now, p.health)
    if lost:
        reread_troubles(p, lost)
    action = failure_action(
        p.job.spec, p.status, p.group, group_started=p.status.group_start_time is not None,
        now=p.now, troubles=p.troubles, health=p.health,
        renewals=renewals_of(p) if p.group.with_phase(WorkerPhase.FAILED) else None,
    )
    if action.kind is ActionKind.NONE:
        p.wake_at(lost_node_deadline(p.job.spec, p.group, p.troubles, p.health))
        return Flow.CONTINUE
    apply(p, action)
    return Flow.DONE if action.kind is not ActionKind.WAIT else Flow.CONTINUE


def placement_policy(p: Pass) -> Flow:
    """A group the scheduler refuses is placed again where it would fit: on another GPU
    product once its own is full (policy.product_full_action), or once a node it was created
    to avoid is back (policy.replacement_action; until then the pass looks again every few
    seconds)."""
    if apply(p, _product_full_action(p)):
        return Flow.DONE
    avoided = {node for w in p.group.workers for node in w.avoided_nodes}
    if not avoided:
        return Flow.CONTINUE
    pod_spec = render_worker_pod(p.job, 0, p.status.group_generation, owner_reference(p.job),
                                 gpu_product=p.status.gpu_product)["spec"]
    could_host = {node for node in avoided
                  if (manifest := p.cluster.cached_node(node)) and may_host(manifest, pod_spec)}
    action = replacement_action(p.group, node_troubles(p.cluster, avoided, p.now), could_host)
    apply(p, action)
    return Flow.DONE if action.kind is ActionKind.REPLACE_GROUP else Flow.CONTINUE


def _product_full_action(p: Pass) -> Action:
    spec, product = p.job.spec, p.status.gpu_product
    if spec.gpu_product is not None or product is None or \
            not any(GPU_RESOURCE in w.message for w in p.group.with_phase(WorkerPhase.PENDING)):
        return NO_ACTION
    try:
        gpus = gpus_per_worker(spec.template.as_dict())
    except GpuRequestError:
        return NO_ACTION  # placed without GPUs: nothing to move
    free = free_room(usable_nodes(p), gpus, held_gpus(p.cluster.cached_all_pods(), p.job.uid))
    return product_full_action(p.group, product, spec.gpu_product, free)


def hang_policy(p: Pass) -> Flow:
    """Restart the group (spending a restart) when no worker advanced for
    spec.health.progressTimeoutSeconds (hang.py); the worker that stopped first is blamed."""
    if not p.group.all_running or p.group.stale:
        return Flow.CONTINUE
    stall = find_stall(current_health(p), p.job.spec.health.progress_timeout_seconds)
    return Flow.DONE if apply(p, hang_action(p.job.spec, p.status, stall)) else Flow.CONTINUE


def compute_status(p: Pass) -> Flow:
    """The Running condition from the observed group (the phase follows in commit.py)."""
    group = p.group
    if group.all_running and not group.stale:
        group_running(p)
        return Flow.CONTINUE
    reason, message = p.blocked or still_blocked(p) or why_not_placed(p) or waiting_for(p)
    not_running(p, reason, message)
    p.wake_at(startup_deadline(p.job.spec, group, p.status.placing_since))
    return Flow.CONTINUE


STEPS: tuple[Callable[[Pass], Flow], ...] = (
    stop_if_finished,
    delete_stale_pods,
    release_in_place,  # inplace.py
    remember_exits,  # inplace.py
    admit_through_queue,  # queueing.py: Kueue
    suspend_or_resume,
    record_progress,
    success_policy,
    failure_policy,
    placement_policy,
    resize_policy,  # elastic.py: spec.elastic
    hang_policy,
    ensure_workers,  # creation.py
    compute_status,
)


# --- helpers of the steps ---


MOST_SPARED = 100  # pods a GenerationDeletion's field selector may leave out by name


def _delete_generation(p: Pass, generation: int | None, grace: int | None,
                       pods: list[StalePod]) -> list[PodDeletion]:
    """Delete `pods` (every pod of `generation` not yet terminating) by label selector, in one
    log line, sparing by name the pods that carry the same labels and must be left alone:
    those already terminating and any not controlled by the job. The deletions to make one by
    one instead: the current generation's strays, pods without a worker index, too many to
    spare."""
    p.log.info("deleting %s of generation %s%s", _some([pod.name for pod in pods]), generation,
               "" if grace is None else f" within {grace}s: its group is broken")
    one_by_one = [PodDeletion(p.job.namespace, pod.name, pod.uid, grace=grace) for pod in pods]
    if generation is None or generation >= p.status.group_generation \
            or any(pod.index is None for pod in pods):
        return one_by_one
    spared = {pod.name for pod in p.group.stale
              if pod.generation == generation and pod.deletion is not None}
    spared.update(p.group.foreign)
    if len(spared) > MOST_SPARED:
        return one_by_one
    p.cluster.delete_generation(GenerationDeletion(
        p.job.namespace, p.job.name, generation, tuple(one_by_one),
        tuple(pod.index for pod in pods if pod.index is not None), grace,
        tuple(sorted(spared))))
    return []


def _clean_finished_pods(p: Pass) -> None:
    """Delete what spec.cleanPodPolicy says: pods still running, or all of them. "Running"
    is the pod's phase, not the trainer's: a pod whose trainer ended while a sidecar runs on
    still holds its node's GPUs."""
    everything = p.job.spec.clean_pod_policy is CleanPodPolicy.ALL
    ns = p.job.namespace
    deletions = [PodDeletion(ns, w.pod, w.uid) for w in p.group.workers
                 if not w.terminating and w.phase is not WorkerPhase.MISSING and w.uid
                 and (everything or not w.pod_ended)]
    deletions += [PodDeletion(ns, pod.name, pod.uid) for pod in p.group.stale
                  if pod.deletion is None]
    p.cluster.delete_pods(deletions)


def _some(names: list[str], shown: int = 3) -> str:
    """`names` for a log line: all of a few, the first `shown` and a count of many."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{len(names)} pods ({', '.join(names[:shown])} and {len(names) - shown} more)"
