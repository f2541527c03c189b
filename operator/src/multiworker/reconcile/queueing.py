"""A job labelled `kueue.x-k8s.io/queue-name` runs only while Kueue admits it.

The job's Workload (decide/queueing.py) is created before any pod; until Kueue admits it the
job is Queued with Kueue's own words, and no pod exists. Admitted, the group starts with the
flavors' node labels and tolerations (creation.py reads `Pass.flavor_fields`). Evicted or
preempted, the group stops the way a suspended one does — its pods are deleted with their
grace period, so trainers take the SIGTERM checkpoint — and once no pod is left the
admission is cleared, which gives the quota back; admitted again, the next generation resumes
from that checkpoint. A finished job marks its Workload Finished and lets it go."""

from __future__ import annotations

from dataclasses import replace

from multiworker.api import names
from multiworker.api.conditions import Reason, Type, find, is_true
from multiworker.api.status import Phase
from multiworker.clients.writes import Conflict, Created, Gone, Refused
from multiworker.decide import history
from multiworker.decide.queueing import (
    FINALIZER,
    GROUP_VERSION,
    WORKLOADS,
    Admission,
    QueueState,
    desired_workload,
    finished,
    flavor_fields,
    is_active,
    local_queue_path,
    pods_ready,
    priority_of,
    queue_name,
    quota_released,
    read_workload,
    waiting_message,
    workload_path,
)
from multiworker.reconcile.context import Flow, Manifest, Pass
from multiworker.reconcile.render import owner_reference
from multiworker.reconcile.transitions import forget_group

NOT_INSTALLED_RETRY_SECONDS = 30.0
CACHE_RETRY_SECONDS = 1.0


def admit_through_queue(p: Pass) -> Flow:
    """The step: CONTINUE only while Kueue admits the job (or it names no queue, or it is
    suspended: suspend_or_resume stops it, and its Workload leaves the queue)."""
    queue = queue_name(p.body["metadata"].get("labels"))
    if queue is None:
        return Flow.CONTINUE
    workloads = _cached_workloads(p, queue)
    if workloads is None:
        return Flow.DONE
    desired = _desired(p, queue)
    if desired is None:
        return Flow.DONE
    name = desired["metadata"]["name"]
    ours = [w for w in workloads if _owned(p, w)]
    current = next((w for w in ours if w["metadata"]["name"] == name), None)
    if not _retire(p, [w for w in ours if w["metadata"]["name"] != name]):
        return _hold(p, Reason.WORKLOAD_REPLACED,
                     f"the job changed: its group stops before Workload {name} is queued")
    if current is None:
        return _create(p, queue, desired)
    state = read_workload(current)
    if p.job.spec.suspend:
        return _suspended(p, current, state)
    if not is_active(current):
        _patch(p, current, {"spec": {"active": True}})
    return _follow(p, queue, current, state)


def _follow(p: Pass, queue: str, workload: Manifest, state: QueueState) -> Flow:
    """What Kueue's answer means for the group."""
    if state.admission is Admission.ADMITTED:
        if not _sized_by_admission(p, state):
            return Flow.DONE
        _admitted(p, queue, workload, state)
        return Flow.CONTINUE
    p.status.admitted_workers = None
    if state.admission is Admission.FINISHED:
        return Flow.CONTINUE
    if state.admission is Admission.EVICTED:
        return _evicted(p, queue, workload, state)
    if state.cluster_queue is None:  # where it waits: the LocalQueue says (Kueue, if not)
        found = p.cluster.get_object(local_queue_path(p.job.namespace, queue)) or {}
        state = replace(state, cluster_queue=(found.get("spec") or {}).get("clusterQueue"))
    return _hold(p, Reason.QUEUED, waiting_message(queue, state))


def _cached_workloads(p: Pass, queue: str) -> list[Manifest] | None:
    """The job's Workloads, or None (the job held, saying why) when Kueue cannot be asked."""
    if not p.options.kueue:
        _hold(p, Reason.KUEUE_DISABLED,
              f"the job names the Kueue queue {queue}, but this operator runs without "
              "--kueue (Helm: kueue.enabled=true): no pod is created")
        return None
    if not p.cluster.api_served(GROUP_VERSION, WORKLOADS):
        p.wake_in(NOT_INSTALLED_RETRY_SECONDS)
        _hold(p, Reason.KUEUE_NOT_INSTALLED,
              f"the job names the Kueue queue {queue}, but the API server does not serve "
              f"{GROUP_VERSION} Workloads: is Kueue installed? No pod is created")
        return None
    workloads = p.cluster.cached_workloads(p.job.namespace, p.job.name)
    if workloads is None:
        p.wake_in(CACHE_RETRY_SECONDS)
    return workloads


def finish_workload(p: Pass) -> None:
    """A finished job's Workload says Finished, then lets go of its quota (the finalizer) —
    once no pod of the job is active: the pods still running when it ended (deleted with
    their grace period, or a sidecar's) hold their nodes' GPUs until they stop, and Kueue
    would admit another workload onto them. Their going wakes the job."""
    if queue_name(p.body["metadata"].get("labels")) is None or not p.options.kueue:
        return
    if _active(p):
        return
    for workload in p.cluster.cached_workloads(p.job.namespace, p.job.name) or []:
        if not _owned(p, workload):
            continue
        path = workload_path(p.job.namespace, workload["metadata"]["name"])
        try:
            if read_workload(workload).admission is not Admission.FINISHED:
                succeeded = p.job.status.phase is Phase.SUCCEEDED
                p.cluster.replace_status(path, workload, finished(
                    workload, succeeded, f"the job {p.job.status.phase}", p.now))
                return  # its watch event brings the next pass, which lets go
            if FINALIZER in (workload["metadata"].get("finalizers") or []):
                p.cluster.drop_finalizer(path, workload, FINALIZER)
        except (Conflict, Gone):
            p.wake_in(CACHE_RETRY_SECONDS)


# --- the states ---


def _desired(p: Pass, queue: str) -> Manifest | None:
    template = p.job.spec.template.as_dict()
    priority = priority_of(p.body["metadata"].get("labels"), template["spec"])
    value = None
    if priority is not None:
        found = p.cluster.get_object(priority.path)
        if found is None:
            p.wake_in(NOT_INSTALLED_RETRY_SECONDS)
            _hold(p, Reason.QUEUED, f"the {priority.kind} {priority.name} does not exist: "
                  "create it, or remove it from the job")
            return None
        value = int(found.get("value") or 0)
    elastic = p.job.spec.elastic
    return desired_workload(
        active=not p.job.spec.suspend, job=p.job.name, namespace=p.job.namespace, uid=p.job.uid,
        owner=owner_reference(p.job), labels={names.LABEL_JOB_NAME: p.job.name}, queue=queue,
        workers=_requested(p), min_workers=elastic.min_workers if elastic else None,
        template=template, priority=priority, priority_value=value)


def _requested(p: Pass) -> int:
    """The workers the Workload asks for: the job's, whatever size spec.elastic gave the
    group (a shrunk group lost nodes, not quota: it keeps its admission and grows back within
    it; asking for fewer replaced the admitted Workload, and the group stopped to queue behind
    it) or Kueue's partial admission capped it (that answer must not change the question)."""
    return p.job.max_workers


def _sized_by_admission(p: Pass, state: QueueState) -> bool:
    """Kueue admitted fewer workers than asked for (partial admission): the group is made at
    that size. False while this pass still sees the job at another size (the next one is
    woken at once)."""
    admitted = state.admitted_workers
    fewer = admitted if admitted is not None and admitted < _requested(p) else None
    if fewer == p.status.admitted_workers:
        return True
    p.status.admitted_workers = fewer
    p.wake_in(0)
    return False


def _owned(p: Pass, workload: Manifest) -> bool:
    return any(ref.get("uid") == p.job.uid and ref.get("controller")
               for ref in workload["metadata"].get("ownerReferences") or [])


def _retire(p: Pass, stale: list[Manifest]) -> bool:
    """Workloads of the job as it was before an edit: the group they admitted stops first,
    then they go. True once none is left to wait for."""
    if not stale:
        return True
    if _active(p):
        _stop_group(p, Reason.WORKLOAD_REPLACED, "the job's spec changed: its group stops "
                    "and is queued again with a new Workload")
        return False
    for workload in stale:
        path = workload_path(p.job.namespace, workload["metadata"]["name"])
        try:
            if FINALIZER in (workload["metadata"].get("finalizers") or []):
                p.cluster.drop_finalizer(path, workload, FINALIZER)
            p.cluster.delete_object(path)
        except (Conflict, Gone):
            p.wake_in(CACHE_RETRY_SECONDS)
    return True


def _suspended(p: Pass, workload: Manifest, state: QueueState) -> Flow:
    """A suspended job's Workload is inactive: Kueue evicts it (Deactivated), and once the
    group is gone its quota goes back. Resumed, it becomes active and is queued again."""
    if is_active(workload):
        _patch(p, workload, {"spec": {"active": False}})
    elif state.admission is Admission.EVICTED and not _active(p):
        _release(p, workload)
    return Flow.CONTINUE  # suspend_or_resume stops the group


def _patch(p: Pass, workload: Manifest, patch: Manifest) -> None:
    p.cluster.patch_object(workload_path(p.job.namespace, workload["metadata"]["name"]), patch)
    p.wake_in(CACHE_RETRY_SECONDS)


def _release(p: Pass, workload: Manifest) -> bool:
    """Give an evicted Workload's quota back (its pods are gone); False on a stale read."""
    try:
        p.cluster.replace_status(workload_path(p.job.namespace, workload["metadata"]["name"]),
                                 workload, quota_released(workload, p.now))
        return True
    except (Conflict, Gone):
        p.wake_in(CACHE_RETRY_SECONDS)
        return False


def _create(p: Pass, queue: str, desired: Manifest) -> Flow:
    name = desired["metadata"]["name"]
    try:
        created = p.cluster.create_object(workload_path(p.job.namespace), desired)
    except Refused as e:
        return _hold(p, Reason.WORKLOAD_REFUSED,
                     f"the API server refused Workload {name}: {e.message}")
    if created is Created.CREATED:
        p.emit(Reason.QUEUED, f"Workload {name} created in LocalQueue {queue}")
    p.wake_in(CACHE_RETRY_SECONDS)  # its watch event normally comes first
    return _hold(p, Reason.QUEUED, f"queued in LocalQueue {queue}: Workload {name} created")


def _admitted(p: Pass, queue: str, workload: Manifest, state: QueueState) -> None:
    flavors = [f for name in dict.fromkeys(state.flavors.values())
               if (f := p.cluster.get_object(
                   f"/apis/{GROUP_VERSION}/resourceflavors/{name}")) is not None]
    p.flavor_fields = flavor_fields(flavors)
    if is_true(p.job.status.conditions, Type.QUEUED) or \
            find(p.job.status.conditions, Type.QUEUED) is None:
        used = ", ".join(f"{r}: {f}" for r, f in sorted(state.flavors.items())) or "none"
        part = (f"{p.status.admitted_workers} of {_requested(p)} workers (the quota's "
                "partial admission, spec.elastic.minWorkers) " if p.status.admitted_workers
                else "")
        message = (f"{part}admitted by ClusterQueue {state.cluster_queue} through LocalQueue "
                   f"{queue} (flavors: {used})")
        p.condition(Type.QUEUED, "False", Reason.ADMITTED, message)
        p.emit(Reason.ADMITTED, message)
    ready = pods_ready(workload, p.group.all_running and not p.group.stale, p.now)
    if ready is not None:
        try:
            p.cluster.replace_status(
                workload_path(p.job.namespace, workload["metadata"]["name"]), workload, ready)
        except (Conflict, Gone):
            p.wake_in(CACHE_RETRY_SECONDS)


def _evicted(p: Pass, queue: str, workload: Manifest, state: QueueState) -> Flow:
    held = find(p.job.status.conditions, Type.QUEUED)
    reason = Reason.PREEMPTED if state.reason == "Preempted" else Reason.EVICTED
    if held is None or held.reason not in (Reason.PREEMPTED, Reason.EVICTED):
        by = f" ({state.preempted})" if state.preempted else ""
        p.emit(reason, f"Kueue evicted the job: {state.reason}: {state.message}{by}; the "
               "group stops, checkpointing on SIGTERM, and waits to be admitted again")
    if _active(p):
        _stop_group(p, reason, f"Kueue evicted the job: {state.reason}: {state.message}")
    elif state.reserved and _release(p, workload):
        p.emit(Reason.REQUEUED, f"every worker stopped: quota returned to ClusterQueue "
               f"{state.cluster_queue}; queued again in LocalQueue {queue}")
    return _hold(p, reason, waiting_message(queue, state), stop=False)


def _active(p: Pass) -> bool:
    return any((pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
               for pod in p.pods)


def _stop_group(p: Pass, reason: str, message: str) -> None:
    """As on suspend: the group becomes stale (deleted with its grace period next pass)."""
    s = p.status
    if p.group.has_pods or s.group_start_time is not None:
        s.history = history.ended(s.history, s.group_generation, reason, message, p.now)
        s.group_generation += 1
        forget_group(s)
        p.wake_in(0)
    s.group_start_time = s.restart_after = s.recovering_since = None
    s.blocked_since = None


def _hold(p: Pass, reason: str, message: str, stop: bool = True) -> Flow:
    """No group runs: the job is Queued, saying why."""
    if stop:
        _stop_group(p, reason, message)
    held = find(p.status.conditions, Type.QUEUED)
    if held is None or held.status != "True" or held.reason != reason or \
            held.message != message:
        p.condition(Type.QUEUED, "True", reason, message)
        if reason in (Reason.KUEUE_DISABLED, Reason.KUEUE_NOT_INSTALLED,
                      Reason.WORKLOAD_REFUSED):
            p.emit(reason, message)
    return Flow.DONE
