"""Creating a group: the step that places it (one GPU product), makes the headless Service
and all worker pods at once, and answers the API server's refusals — an invalid or forbidden
pod fails the job, a quota retries the whole group with backoff until the startup timeout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from multiworker.conditions import Reason, Type, find
from multiworker.context import Flow, Pass
from multiworker.gpus import gpus_per_worker, place
from multiworker.k8s import Created, RefusalKind, Refused
from multiworker.observe import WorkerPhase
from multiworker.ownership import Owned, ownership
from multiworker.policy import Action, ActionKind, refused_start_action
from multiworker.render import owner_reference, render_service, render_worker_pod
from multiworker.status import Phase
from multiworker.transitions import abandon_group, finish

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


def still_blocked(p: Pass) -> tuple[str, str] | None:
    """While waiting to retry a group the quota refused (or no GPU product can hold), keep
    saying so."""
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
