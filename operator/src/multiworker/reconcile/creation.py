"""Creating a group: the step that places it (one GPU product), makes its gang's PodGroup (if
gang-scheduled), the headless Service and all worker pods at once, and answers the API
server's refusals — an invalid or forbidden pod fails the job, a quota retries the whole group
with backoff until the startup timeout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from multiworker.api import names
from multiworker.api.conditions import Reason, Type, find
from multiworker.api.status import Phase
from multiworker.clients.writes import Created, RefusalKind, Refused
from multiworker.decide import history
from multiworker.decide.fit import may_host
from multiworker.decide.gpus import GpuRequestError, gpus_per_worker, held_gpus, place
from multiworker.decide.inplace import agent_blocker
from multiworker.decide.ownership import Owned, ownership
from multiworker.decide.placement import (
    gang_waiting_message,
    is_bound,
    partial_placement_message,
    scheduling_message,
)
from multiworker.decide.policy import (
    PASSING_REFUSALS,
    Action,
    ActionKind,
    refused_start_action,
)
from multiworker.decide.queueing import on_flavor_nodes, with_flavor_fields
from multiworker.decide.warm import warm_command
from multiworker.decide.workers import WorkerPhase
from multiworker.reconcile.agent_keys import agent_key_found, new_agent_key
from multiworker.reconcile.context import Flow, Pass
from multiworker.reconcile.gang import (
    API_VERSION,
    PLURAL,
    gang_enabled,
    gang_pod_fields,
    pod_group_name,
    pod_group_path,
    render_pod_group,
    unavailable_message,
    with_gang_fields,
)
from multiworker.reconcile.render import (
    in_place,
    owner_reference,
    render_cluster_config,
    render_network_policy,
    render_service,
    render_worker_pod,
)
from multiworker.reconcile.transitions import abandon_group, finish

Manifest = dict[str, Any]

CONFLICT_RETRY_SECONDS = 30.0


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
    gang = gang_enabled(p.job.spec, p.options.gang_default)
    owner = owner_reference(p.job)
    if not _prepared(p, owner, gang):
        return Flow.CONTINUE if p.status.completion_time is None else Flow.DONE
    # Nodes whose Lease went silent look Ready to the scheduler for ~50 s more: a new group
    # placed there (after a lost node's pods were force-deleted) would never start.
    avoid = sorted(p.cluster.silent_nodes())
    if avoid:
        p.log.info("placing the group away from nodes with a silent Lease: %s", ", ".join(avoid))
    def render(index: int, agent: bool) -> Manifest:
        pod = render_worker_pod(p.job, index, s.group_generation, owner, image=s.pinned_image,
                                gpu_product=s.gpu_product, avoid_nodes=avoid, agent=agent)
        return with_flavor_fields(pod, p.flavor_fields) if p.flavor_fields else pod

    agent = in_place(p.job) and _agent_allowed(p, render(0, False))
    pods = [render(w.index, agent) for w in missing]
    if gang:
        fields = gang_pod_fields(p.job, s.group_generation)
        pods = [with_gang_fields(pod, fields) for pod in pods]
    results = p.cluster.create_pods(pods)
    refused = next(((w.index, r) for w, r in zip(missing, results, strict=True)
                    if isinstance(r, Refused)), None)
    if refused is not None:
        return _refused(p, *refused, created=any(r is Created.CREATED for r in results))
    if not _existing_are_ours(p, pods, results):
        return Flow.CONTINUE
    s.group_start_time, s.restart_after, s.blocked_since = p.now, None, None
    s.start_time = s.start_time or p.now
    s.history = history.began(s.history, s.group_generation, len(p.group.workers), "Created",
                              p.now)
    p.created = [pod["metadata"]["name"] for pod, r in zip(pods, results, strict=True)
                 if r is Created.CREATED]
    created = len(p.created)
    if created:
        p.emit(Reason.GROUP_CREATED,
               f"created {created} workers of generation {s.group_generation}")
        _say_why_cold(p, agent)
    return Flow.CONTINUE


def _say_why_cold(p: Pass, agent: bool) -> None:
    """Pods restartable in place whose trainers will restart cold though the job asks for a
    warm spare (decide/warm.py): say why, with the group's creation."""
    restart = p.job.spec.restart_policy
    if not agent or not restart.warm_standby:
        return
    trainer = next(c for c in p.job.spec.template.as_dict()["spec"]["containers"]
                   if c.get("name") == p.job.spec.template.trainer_container())
    why = warm_command(trainer)
    if isinstance(why, str):
        p.emit(Reason.WARM_STANDBY_OFF, f"in-place restarts start the trainer cold: {why}")


def _agent_allowed(p: Pass, pod: Manifest) -> bool:
    """Whether the new pods, rendered as `pod` (its GPU product's nodeSelector included), may
    carry the in-place agent (decide/inplace.agent_blocker): without it they restart by
    recreation, which the next restart's Event says."""
    why = agent_blocker(pod["spec"], p.cluster.cached_nodes())
    if why is not None:
        p.log.info("worker pods without the in-place agent: %s", why)
    return why is None


def _prepared(p: Pass, owner: Manifest, gang: bool) -> bool:
    """What a new group needs before its pods: a GPU product, its gang's PodGroup, the
    Service. (Pods that exist already had all that.)"""
    if not p.group.has_pods and not (_place_group(p) and (not gang or
                                                          _ensure_pod_group(p, owner))):
        return False
    return (_ensure_service(p, owner) and _ensure_cluster_config(p, owner)
            and _ensure_agent_key(p, owner) and _ensure_network_policy(p, owner))


def _existing_are_ours(p: Pass, pods: list[Manifest], results: list[Created | Refused]) -> bool:
    """A pod name that was taken: ours from this generation (a pass that died mid-way), or
    wait / report a conflict."""
    for pod, result in zip(pods, results, strict=True):
        if result is Created.EXISTS:
            name = pod["metadata"]["name"]
            found = ownership(p.cluster.get_pod(p.job.namespace, name), p.job.uid,
                              generation=p.status.group_generation)
            if found is not Owned.OURS:
                _wait_or_conflict(p, found, "pod", name)
                return False
    return True


_PASSING = {RefusalKind.QUOTA: Reason.QUOTA_EXCEEDED,
            RefusalKind.SERVICE_ACCOUNT: Reason.SERVICE_ACCOUNT_MISSING}


def _refused(p: Pass, worker: int, refusal: Refused, created: bool) -> Flow:
    action = refused_start_action(p.job.spec, p.status, p.now, refusal.message,
                                  _PASSING.get(refusal.kind), worker=worker)
    if refusal.kind is RefusalKind.INVALID:
        action = Action(ActionKind.FAIL_JOB, Reason.INVALID_POD_TEMPLATE,
                        f"the API server rejected worker-{worker}'s pod: {refusal.message}")
    if action.kind is ActionKind.FAIL_JOB:
        finish(p, Phase.FAILED, action)
        return Flow.DONE
    if created or p.group.has_pods:
        abandon_group(p, action.reason, action.message)  # no partial group waits for peers
    s = p.status
    s.blocked_since = s.blocked_since or p.now
    s.restart_after = p.now + timedelta(seconds=action.delay_seconds)
    p.blocked = (action.reason, action.message)
    p.wake_in(action.delay_seconds)
    return Flow.CONTINUE


def still_blocked(p: Pass) -> tuple[str, str] | None:
    """While waiting to retry a group the API server refused for a while (quota, a service
    account not there yet) or no GPU product can hold, keep saying so."""
    if p.status.blocked_since is None:
        return None
    old = find(p.job.status.conditions, Type.RUNNING)
    if old is not None and old.reason in (*PASSING_REFUSALS, Reason.NO_GPU_PRODUCT,
                                          Reason.GANG_UNAVAILABLE):
        return old.reason, old.message
    return None


def why_not_placed(p: Pass) -> tuple[str, str] | None:
    """While some workers of the current group are not bound to a node: for a gang, that it
    waits whole and for what; otherwise, which workers cannot be placed, what the placed ones
    hold meanwhile and which jobs hold the rest (placement.py)."""
    generation = str(p.status.group_generation)
    current = [pod for pod in p.pods
               if pod["metadata"].get("labels", {}).get(names.LABEL_GROUP_GENERATION)
               == generation and not pod["metadata"].get("deletionTimestamp")]
    if not current or all(is_bound(pod) for pod in current):
        return None
    workers, spec = p.job.spec.workers, p.job.spec
    if gang_enabled(spec, p.options.gang_default):
        name = pod_group_name(p.job.name, p.status.group_generation)
        pod_group = p.cluster.get_object(pod_group_path(p.job.namespace, name))
        message = gang_waiting_message(workers, current, pod_group, spec.gang.scheduler_name,
                                       p.cluster.cached_all_pods(), p.job.namespace)
        return (Reason.WAITING_FOR_GANG, message) if message else None
    if not any(scheduling_message(pod) for pod in current if not is_bound(pod)):
        return None  # not refused by the scheduler, only not placed yet: no need for all pods
    message = partial_placement_message(workers, current, p.cluster.cached_all_pods(),
                                        p.job.namespace)
    return (Reason.UNSCHEDULABLE, message) if message else None


def _place_group(p: Pass) -> bool:
    """Choose the GPU product of a new group (gpus.py); False when no single product can
    hold it."""
    s, spec = p.status, p.job.spec
    try:
        gpus = gpus_per_worker(spec.template.as_dict())
    except GpuRequestError as e:
        finish(p, Phase.FAILED, Action(ActionKind.FAIL_JOB, Reason.INVALID_POD_TEMPLATE, str(e)))
        return False
    held = held_gpus(p.cluster.cached_all_pods(), p.job.uid) if gpus > 0 else None
    placement = place(usable_nodes(p), spec.workers, gpus, spec.gpu_product, held)
    if placement.problem is not None:
        return _hold_back(p, Reason.NO_GPU_PRODUCT, placement.problem)
    s.gpu_product = placement.product
    return True


def usable_nodes(p: Pass) -> list[Manifest]:
    """The nodes the job's workers may land on: their node selector, required affinity and
    tolerations allow it, and Kueue admitted the group to its flavors' nodes. A GPU product
    found only on other nodes (a tainted pool, another team's) is no candidate."""
    pod_spec = p.job.spec.template.as_dict().get("spec") or {}
    return [n for n in p.cluster.cached_nodes() if may_host(n, pod_spec)
            and (p.flavor_fields is None or on_flavor_nodes(n, p.flavor_fields))]


def _ensure_pod_group(p: Pass, owner: Manifest) -> bool:
    """The gang's PodGroup for this generation, before any of its pods (gang.py); False
    while the PodGroup API is not served or the name is taken."""
    ns, generation = p.job.namespace, p.status.group_generation
    if not p.cluster.api_served(API_VERSION, PLURAL):
        return _hold_back(p, Reason.GANG_UNAVAILABLE,
                          unavailable_message(p.job.spec.gang.scheduler_name))
    pod_group = render_pod_group(p.job, generation, owner)
    if p.cluster.create_object(pod_group_path(ns), pod_group) is Created.CREATED:
        return True
    name = pod_group["metadata"]["name"]
    found = ownership(p.cluster.get_object(pod_group_path(ns, name)), p.job.uid,
                      generation=generation)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "PodGroup", name)
    return False


def _hold_back(p: Pass, reason: str, problem: str) -> bool:
    """Do not create the group yet, and say why (Running=False, one Warning); after
    spec.health.startupTimeoutSeconds of this, fail the job. Always False."""
    s = p.status
    since = s.blocked_since or p.now
    waited = (p.now - since).total_seconds()
    timeout = p.job.spec.health.startup_timeout_seconds
    if timeout is not None and waited >= timeout:
        finish(p, Phase.FAILED, Action(ActionKind.FAIL_JOB, Reason.STARTUP_TIMEOUT,
                                       f"{problem} for {waited:.0f}s "
                                       "(spec.health.startupTimeoutSeconds)"))
        return False
    s.blocked_since = since
    p.blocked = (reason, problem)
    p.wake_in(min(30.0, timeout - waited) if timeout is not None else 30.0)
    return False


def _ensure_service(p: Pass, owner: Manifest) -> bool:
    service = render_service(p.job, owner)
    try:
        if p.cluster.create_service(service) is Created.CREATED:
            return True
    except Refused as e:
        return _object_refused(p, "Service", e)
    name = service["metadata"]["name"]
    found = ownership(p.cluster.get_service(p.job.namespace, name), p.job.uid, generation=None)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "service", name)
    return False


def _ensure_cluster_config(p: Pass, owner: Manifest) -> bool:
    """The ConfigMap the workers' TF_CONFIG takes its addresses from (render.py), before the
    pods. Its name says what it holds, so one that exists already is this group's."""
    config = render_cluster_config(p.job, owner)
    try:
        p.cluster.create_object(names.config_map_path(p.job.namespace), config)
    except Refused as e:
        return _object_refused(p, f"ConfigMap {config['metadata']['name']}", e)
    return True


def _object_refused(p: Pass, what: str, e: Refused) -> bool:
    """The API server refused an object the pods need: the job fails, naming it."""
    finish(p, Phase.FAILED, Action(ActionKind.FAIL_JOB, Reason.POD_REFUSED,
                                   f"the API server refused the job's {what}: {e.message}"))
    return False


def _ensure_agent_key(p: Pass, owner: Manifest) -> bool:
    """An in-place job's signing key (agent_keys.py), before the pods that mount it."""
    if not in_place(p.job):
        return True
    secret = new_agent_key(p.job, owner)
    name = secret["metadata"]["name"]
    try:
        if p.cluster.create_object(names.secret_path(p.job.namespace), secret) \
                is Created.CREATED:
            return True
    except Refused as e:
        return _object_refused(p, f"Secret {name} (the in-place agents' key)", e)
    found, _ = agent_key_found(p)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "Secret", name)
    return False


def _ensure_network_policy(p: Pass, owner: Manifest) -> bool:
    """With --worker-network-policy, the job's NetworkPolicy before its pods (render.py)."""
    operator_namespace = p.options.policy_operator_namespace
    if operator_namespace is None:
        return True
    policy = render_network_policy(p.job, owner, operator_namespace)
    ns, name = p.job.namespace, policy["metadata"]["name"]
    if p.cluster.create_object(names.network_policy_path(ns), policy) is Created.CREATED:
        return True
    found = ownership(p.cluster.get_object(names.network_policy_path(ns, name)), p.job.uid,
                      generation=None)
    if found is Owned.OURS:
        return True
    _wait_or_conflict(p, found, "NetworkPolicy", name)
    return False


def _wait_or_conflict(p: Pass, found: Owned, kind: str, name: str) -> None:
    if found is Owned.WAIT:
        p.wake_in(1)
        return
    p.blocked = (Reason.OBJECT_CONFLICT, f"{kind} {name} exists and is not controlled by "
                                         "this job; delete it or rename the job")
    p.wake_in(CONFLICT_RETRY_SECONDS)
