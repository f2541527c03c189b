"""Why a worker group is not placed yet, in words, for the Running condition while it waits.

Two situations: a gang-scheduled group waits whole (none of its pods is bound until all fit),
and a group scheduled pod by pod sits partly placed, holding resources it cannot use yet. Both
messages name what is missing (the scheduler's `Insufficient <resource>`) and who holds it.
Pure: pods and PodGroups are API dicts; the caller lists them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from multiworker.api import names
from multiworker.decide.quantity import parse_or_zero

Pod = Mapping[str, Any]

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9][A-Za-z0-9./_-]*[A-Za-z0-9])")
_BINARY_UNITS = (("Ti", Decimal(2**40)), ("Gi", Decimal(2**30)), ("Mi", Decimal(2**20)),
                 ("Ki", Decimal(2**10)))
_MESSAGE_CHARS = 300
NAMED_HOLDERS = 5  # holders a message names; the rest are counted
OTHER_NAMESPACES = "other namespaces"


@dataclass(frozen=True)
class PodGroupState:
    """What the PodGroup controller last counted (phase is empty until it has looked)."""

    name: str
    phase: str
    min_member: int
    running: int = 0
    succeeded: int = 0
    failed: int = 0


def pod_group_state(pod_group: Mapping[str, Any] | None) -> PodGroupState | None:
    if not pod_group:
        return None
    spec, status = pod_group.get("spec") or {}, pod_group.get("status") or {}
    return PodGroupState(
        name=pod_group.get("metadata", {}).get("name", ""), phase=status.get("phase", ""),
        min_member=int(spec.get("minMember", 0)), running=int(status.get("running", 0)),
        succeeded=int(status.get("succeeded", 0)), failed=int(status.get("failed", 0)),
    )


def format_amount(resource: str, amount: Decimal) -> str:
    if resource == "memory" or resource.endswith("storage"):
        for suffix, unit in _BINARY_UNITS:
            if amount >= unit and amount % unit == 0:
                return f"{amount / unit:f}{suffix}"
    return f"{amount.normalize():f}"


def pod_request(pod: Pod, resource: str) -> Decimal:
    """What the pod requests of `resource` as the scheduler counts it (a limit alone counts as
    the request, as the API server defaults it): its containers, plus its native sidecars
    (init containers with restartPolicy Always, such as the in-place agent) which run beside
    them; an ordinary init container runs alone with the sidecars started before it, so the
    larger of the two; plus the pod's overhead (its RuntimeClass's)."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> Decimal:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(resource)
        if value is None:
            value = (resources.get("limits") or {}).get(resource)
        return parse_or_zero(value) if value is not None else Decimal(0)

    running = sum((of(c) for c in spec.get("containers") or []), Decimal(0))
    sidecars = init = Decimal(0)
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            sidecars += of(container)
            running += of(container)
            init = max(init, sidecars)
        else:
            init = max(init, of(container) + sidecars)
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(running, init) + (parse_or_zero(overhead) if overhead is not None else 0)


def is_bound(pod: Pod) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def holds_resources(pod: Pod) -> bool:
    """Bound and not finished: its requests count against its node."""
    return is_bound(pod) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def scheduling_message(pod: Pod) -> str | None:
    """The scheduler's last word on an unbound pod (PodScheduled=False), or None."""
    for cond in (pod.get("status") or {}).get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled")
    return None


def missing_resources(messages: Iterable[str]) -> list[str]:
    """Resources the scheduler found too little of, in order of first mention."""
    found: list[str] = []
    for message in messages:
        for resource in _INSUFFICIENT.findall(message):
            if resource not in found:
                found.append(resource)
    return found


@dataclass(frozen=True)
class Holder:
    """Who holds some of a resource: a job (by its pods' job label) or a lone pod."""

    owner: str
    pods: int
    amount: Decimal


def resource_holders(pods: Iterable[Pod], resource: str, namespace: str) -> list[Holder]:
    """Holders of `resource` among `pods` (e.g. every pod on the nodes), largest first. Only
    the job's own `namespace` is named: a condition is read by every user of that namespace,
    so what other tenants run is one count, "other namespaces"."""
    totals: dict[str, tuple[int, Decimal]] = {}
    for pod in pods:
        amount = pod_request(pod, resource)
        if amount <= 0 or not holds_resources(pod):
            continue
        meta = pod.get("metadata", {})
        job = meta.get("labels", {}).get(names.LABEL_JOB_NAME)
        if meta.get("namespace", "") != namespace:
            owner = OTHER_NAMESPACES
        else:
            owner = f"job {job}" if job else f"pod {meta.get('name', '')}"
        count, total = totals.get(owner, (0, Decimal(0)))
        totals[owner] = (count + 1, total + amount)
    holders = [Holder(owner, count, total) for owner, (count, total) in totals.items()]
    return sorted(holders, key=lambda h: (-h.amount, h.owner))


def holders_text(resource: str, holders: Sequence[Holder]) -> str:
    """At most NAMED_HOLDERS holders by name, the rest counted: a message stays short however
    many jobs share the nodes."""
    if not holders:
        return f"no running pod holds {resource}"

    def held(amount: Decimal, pods: int) -> str:
        return f"{format_amount(resource, amount)} ({pods} pod{'s' * (pods != 1)})"

    parts = [f"{h.owner} {held(h.amount, h.pods)}" for h in holders[:NAMED_HOLDERS]]
    rest = holders[NAMED_HOLDERS:]
    if rest:
        amount = sum((h.amount for h in rest), Decimal(0))
        parts.append(f"{len(rest)} more holders {held(amount, sum(h.pods for h in rest))}")
    return f"{resource} is held by " + ", ".join(parts)


def _worker(pod: Pod) -> str:
    index = pod.get("metadata", {}).get("labels", {}).get(names.LABEL_WORKER_INDEX, "?")
    return f"worker-{index}"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _best_reason(unbound: Sequence[Pod]) -> tuple[Pod, str] | None:
    """The most telling scheduler message: a fit error naming resources beats the plugin's
    own rejections ("rejected due to timeout", "optimistic rejection")."""
    said = [(pod, msg) for pod in unbound if (msg := scheduling_message(pod))]
    if not said:
        return None
    return min(said, key=lambda pm: ("Insufficient" not in pm[1],
                                     "nodes are available" not in pm[1]))


def _shortage(resources: Sequence[str], pods: Sequence[Pod], cluster_pods: Sequence[Pod],
              namespace: str) -> str:
    """For each missing resource: what the whole group needs and who holds it now."""
    parts = []
    for resource in resources:
        need = sum((pod_request(p, resource) for p in pods), Decimal(0))
        text = f"not enough free {resource} (the group needs {format_amount(resource, need)}"
        holders = resource_holders(cluster_pods, resource, namespace)
        parts.append(f"{text}; {holders_text(resource, holders)})")
    return "; ".join(parts)


def gang_waiting_message(workers: int, pods: Sequence[Pod], pod_group: Mapping[str, Any] | None,
                         scheduler_name: str, cluster_pods: Sequence[Pod] = (),
                         namespace: str = "") -> str | None:
    """The Running condition's message while a gang-scheduled group waits; None once every
    worker is bound. `pods` are the current generation's, `cluster_pods` every pod that may
    hold what the group lacks (say, all pods on the nodes)."""
    bound = [p for p in pods if is_bound(p)]
    if len(bound) >= workers:
        return None
    head = (f"waiting for the whole group to fit: {len(bound)} of {workers} workers bound; "
            f"the scheduler binds none until all {workers} fit at once")
    state = pod_group_state(pod_group)
    if pod_group is None:
        return f"{head}; its PodGroup does not exist yet"
    tail = f" (PodGroup {state.name} {state.phase})" if state and state.phase else ""
    if len(pods) < workers:
        return f"{head}; {len(pods)} of {workers} worker pods exist{tail}"
    unbound = [p for p in pods if not is_bound(p)]
    best = _best_reason(unbound)
    if best is None:
        return (f"{head}; scheduler {scheduler_name!r} has not looked at the workers yet — "
                f"is it running?{tail}")
    pod, message = best
    shortage = _shortage(missing_resources(scheduling_message(p) or "" for p in unbound),
                         pods, cluster_pods, namespace)
    detail = f"; {shortage}" if shortage else ""
    return f"{head}{detail}; {_worker(pod)}: {_clip(message)}{tail}"


def partial_placement_message(workers: int, pods: Sequence[Pod],
                              cluster_pods: Sequence[Pod] = (), namespace: str = "") -> str | None:
    """For a group scheduled pod by pod: which workers cannot be placed, what this job already
    holds meanwhile and who holds the rest. None when no worker is unschedulable."""
    unbound = [p for p in pods if not is_bound(p) and scheduling_message(p)]
    if not unbound:
        return None
    bound = [p for p in pods if holds_resources(p)]
    best = _best_reason(unbound)
    assert best is not None
    pod, message = best
    resources = missing_resources(scheduling_message(p) or "" for p in unbound)
    held = ", ".join(
        f"{format_amount(r, sum((pod_request(p, r) for p in bound), Decimal(0)))} {r}"
        for r in resources)
    parts = [f"{len(unbound)} of {workers} workers cannot be scheduled "
             f"({_worker(pod)}: {_clip(message)})"]
    if bound:
        holding = f", holding {held}" if held else ""
        placed = "1 placed worker of this job waits" if len(bound) == 1 else \
            f"{len(bound)} placed workers of this job wait"
        parts.append(f"{placed} for them{holding}")
    parts.extend(holders_text(r, resource_holders(cluster_pods, r, namespace))
                 for r in resources)
    parts.append("gang scheduling (spec.gang.enabled) would hold nothing until all fit")
    return "; ".join(parts)
