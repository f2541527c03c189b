"""Pure: the size of a job's next generation when `spec.elastic` lets it change.

MultiWorkerMirroredStrategy cannot change its size in flight, but every generation builds a
new collective, so between two generations the size may change. Two rules, each with its wait:

- shrink: the current generation's pods have been refused by the scheduler for
  `shrinkAfter` (a lost node, GPUs taken meanwhile): the next generation is as large as
  what is placed now, never below `minWorkers`;
- grow: a shrunk group grows back to the workers the nodes' free room holds (at most
  `spec.workers`) once that room has lasted `growAfter`, counted also from the last resize,
  so room that comes and goes (another job's pods starting) moves nothing.

Room is the scheduler's own arithmetic in brief: on each node that may host a worker
(fit.may_host), the allocatable of every resource a worker requests less what the bound pods
of others request, divided by the worker's request. Node affinity, topology spread and the
like stay the scheduler's; a grow they refuse shows as a refusal, and a shrink follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.decide.fit import may_host
from multiworker.decide.ownership import controlled_by
from multiworker.decide.placement import holds_resources, pod_request
from multiworker.decide.quantity import parse_or_zero

Manifest = Mapping[str, Any]


@dataclass(frozen=True)
class ElasticPolicy:
    """`spec.elastic` with the job's full size."""

    min_workers: int
    max_workers: int
    shrink_after: timedelta
    grow_after: timedelta


@dataclass(frozen=True)
class Resize:
    """The next generation's size, and why (the Shrunk or Grew Event's message)."""

    workers: int
    why: str

    def grows(self, current: int) -> bool:
        return self.workers > current


@dataclass(frozen=True)
class Seen:
    """What the operator sees of the current generation and the cluster now."""

    workers: int  # the current generation's size
    placed: int  # its pods bound to a node
    refused_since: datetime | None  # since when some of its pods are refused by the scheduler
    room: int  # workers the nodes hold, the job's own pods not counted against them (room())
    room_since: datetime | None  # since when the room has held more than `workers`
    resized_at: datetime | None  # the last resize
    refusal: str = ""  # the scheduler's words for the longest-refused pod
    room_on: tuple[tuple[str, int], ...] = ()  # (node, workers its room holds), room's parts


def next_size(policy: ElasticPolicy, seen: Seen, now: datetime) -> Resize | None:
    """A different size for the next generation, or None: keep this one."""
    if seen.workers < min(policy.min_workers, policy.max_workers):
        return _raise_to_minimum(policy, seen)
    if seen.refused_since is not None:
        return _shrink(policy, seen, now)
    return _grow(policy, seen, now)


def next_look(policy: ElasticPolicy, seen: Seen, now: datetime) -> datetime | None:
    """When a wait of next_size ends, so that looking again could resize; None when only a
    change of the pods or the nodes could (each wakes the job by itself). Never a moment
    already past: a group refused at minWorkers once woke every pass at once, for ever."""
    if seen.refused_since is not None:
        at = seen.refused_since + policy.shrink_after
        could = max(policy.min_workers, seen.placed) < seen.workers
    elif seen.room_since is not None:
        at = max(seen.room_since, seen.resized_at or seen.room_since) + policy.grow_after
        could = seen.workers < min(seen.room, policy.max_workers)
    else:
        return None
    return at if could and at > now else None


def _shrink(policy: ElasticPolicy, seen: Seen, now: datetime) -> Resize | None:
    assert seen.refused_since is not None
    waited = now - seen.refused_since
    target = max(policy.min_workers, seen.placed)
    if waited < policy.shrink_after or target >= seen.workers:
        return None
    said = f"; the scheduler: {_clip(seen.refusal)}" if seen.refusal else ""
    return Resize(target, f"{seen.workers - seen.placed} of {seen.workers} workers could not "
                          f"be placed for {waited.total_seconds():.0f}s "
                          f"(spec.elastic.shrinkAfterSeconds "
                          f"{policy.shrink_after.total_seconds():g}): training on with "
                          f"{target} (minWorkers {policy.min_workers}){said}")


def _raise_to_minimum(policy: ElasticPolicy, seen: Seen) -> Resize:
    """minWorkers edited above a shrunk group's size: the job asked never to train with fewer,
    so the next generation has minWorkers now, without waiting for room (placed short, it
    waits like any group whose pods are refused; it never shrinks below minWorkers)."""
    target = min(policy.min_workers, policy.max_workers)
    return Resize(target, f"spec.elastic.minWorkers is {policy.min_workers}, more than the "
                          f"{seen.workers} the group has: growing from {seen.workers} to "
                          f"{target} of {policy.max_workers}")


def _grow(policy: ElasticPolicy, seen: Seen, now: datetime) -> Resize | None:
    if seen.workers >= policy.max_workers or seen.room <= seen.workers or \
            seen.room_since is None:
        return None
    settled_since = max(seen.room_since, seen.resized_at or seen.room_since)
    if now - settled_since < policy.grow_after:
        return None
    target = min(policy.max_workers, seen.room)
    where = ", ".join(f"{node} {n}" for node, n in seen.room_on if n)
    return Resize(target, f"room for {target - seen.workers} more workers for "
                          f"{(now - settled_since).total_seconds():.0f}s: growing from "
                          f"{seen.workers} to {target} of {policy.max_workers}"
                          + (f" (workers each node holds: {where})" if where else ""))


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def policy_of(spec: MultiWorkerJobSpec, max_workers: int) -> ElasticPolicy | None:
    elastic = spec.elastic
    if elastic is None:
        return None
    return ElasticPolicy(min_workers=elastic.min_workers, max_workers=max_workers,
                         shrink_after=timedelta(seconds=elastic.shrink_after_seconds),
                         grow_after=timedelta(seconds=elastic.grow_after_seconds))


def refused_since(pods: Iterable[Manifest]) -> tuple[datetime | None, str]:
    """Since when the scheduler has refused the longest-refused of `pods` (PodScheduled
    False, Unschedulable: its lastTransitionTime, on the scheduler's clock: it orders the
    refusals, the wait is counted on the operator's, status.refusedSince), and its words for
    it; (None, ""): none is refused."""
    refusals = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                    and condition.get("reason") == "Unschedulable":
                stamp = condition.get("lastTransitionTime")
                if stamp:
                    refusals.append((datetime.fromisoformat(str(stamp).replace("Z", "+00:00")),
                                     str(condition.get("message") or "")))
    if not refusals:
        return None, ""
    when, words = min(refusals, key=lambda r: r[0])
    return when, words


def room(nodes: Iterable[Manifest], pods: Iterable[Manifest], pod_spec: Manifest,
         job_uid: str) -> int:
    """Workers of `pod_spec` that fit in what the bound pods of others leave free on the nodes
    that may host one (Ready ones only). The job's own pods do not count against it: they
    are the ones being replaced. A worker that requests nothing fits nowhere by this count
    (the scheduler alone can say), so growing then waits for a refusal-free generation."""
    return sum(room_on_nodes(nodes, pods, pod_spec, job_uid).values())


def room_on_nodes(nodes: Iterable[Manifest], pods: Iterable[Manifest], pod_spec: Manifest,
                  job_uid: str) -> dict[str, int]:
    """room(), node by node: the nodes that may host a worker, each with the workers it
    holds."""
    worker = {"spec": pod_spec}
    wanted = {r: pod_request(worker, r) for r in _resources(pod_spec)}
    wanted = {r: amount for r, amount in wanted.items() if amount > 0}
    if not wanted:
        return {}
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        if holds_resources(pod) and not controlled_by(pod.get("metadata") or {}, job_uid):
            on = used.setdefault(pod["spec"]["nodeName"], {})
            for resource in wanted:
                on[resource] = on.get(resource, Decimal(0)) + pod_request(pod, resource)
    found = {}
    for node in nodes:
        if not _ready(node) or not may_host(node, pod_spec):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        name = str((node.get("metadata") or {}).get("name", ""))
        on = used.get(name, {})
        found[name] = min(int(max(Decimal(0), parse_or_zero(allocatable.get(r) or 0)
                                  - on.get(r, Decimal(0))) // amount)
                          for r, amount in wanted.items())
    return found


def _resources(pod_spec: Manifest) -> set[str]:
    found: set[str] = set()
    for container in [*(pod_spec.get("containers") or []),
                      *(pod_spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        found |= set(resources.get("requests") or {}) | set(resources.get("limits") or {})
    return found


def _ready(node: Manifest) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
