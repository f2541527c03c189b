"""Pure: one GPU product per group. MultiWorkerMirroredStrategy runs in lockstep, so a group
that mixes GPU models trains at the pace of the slowest (or fails on a kernel one model lacks);
where nodes carry NVIDIA's product label, every worker of a group goes to one product.

The choice is made for each new group: among the products whose capacity (allocatable GPUs of
Ready nodes) holds it, one whose GPUs other pods leave free, else the one with most capacity
(where it waits for the scheduler, whose verdict shows as usual).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from multiworker.decide.ownership import controlled_by
from multiworker.decide.placement import holds_resources, pod_request
from multiworker.decide.quantity import parse, parse_or_zero

PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

Manifest = Mapping[str, Any]


@dataclass(frozen=True)
class Placement:
    """Where a group goes: a product (None: no constraint), or why it cannot go anywhere."""

    product: str | None
    problem: str | None = None


class GpuRequestError(ValueError):
    """A worker's GPU request that no node can satisfy as written (a fraction, or not a
    quantity): a spec error, named with the container."""


def gpus_per_worker(template: Manifest) -> int:
    """GPUs one worker asks for: the sum over its containers' limits (requests default to
    limits for extended resources). Quantities parse as Kubernetes parses them ("1.0" and "1"
    are one GPU, "2k" two thousand); GPUs are whole devices, so a fraction is refused."""
    total = Decimal(0)
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(GPU_RESOURCE) or \
            (resources.get("requests") or {}).get(GPU_RESOURCE) or 0
        where = f"spec.template.spec.containers[{container.get('name', '?')}]"
        try:
            gpus = parse(amount)
        except ValueError as e:
            raise GpuRequestError(f"{where}: {GPU_RESOURCE} {e}") from e
        if gpus != gpus.to_integral_value() or gpus < 0:
            raise GpuRequestError(f"{where}: {GPU_RESOURCE} {amount!s} is not a whole number "
                                  "of GPUs (a GPU is not divisible)")
        total += gpus
    return int(total)


def held_gpus(pods: Iterable[Manifest], job_uid: str) -> dict[str, int]:
    """GPUs that other pods hold, by node: bound and not finished; never the job's own (its
    old generation's pods are on their way out)."""
    held: dict[str, int] = {}
    for pod in pods:
        if holds_resources(pod) and not controlled_by(pod.get("metadata") or {}, job_uid):
            node = pod["spec"]["nodeName"]
            held[node] = held.get(node, 0) + int(pod_request(pod, GPU_RESOURCE))
    return held


def free_room(nodes: Iterable[Manifest], gpus: int, held: Mapping[str, int]) -> dict[str, int]:
    """Workers of `gpus` GPUs each that fit, by product, in what other pods leave free."""
    return _room(nodes, gpus, held) if gpus > 0 else {}


def place(nodes: Iterable[Manifest], workers: int, gpus: int, wanted: str | None,
          held: Mapping[str, int] | None = None) -> Placement:
    """The product for a group of `workers` × `gpus`: `wanted` if given (checked), else among
    the products that can hold the whole group one whose free GPUs do (`held`: what other
    pods hold, by node), then the one with the most room."""
    if gpus <= 0:
        return Placement(None)
    nodes = list(nodes)
    room = _room(nodes, gpus)
    free = _room(nodes, gpus, held) if held is not None else room
    if wanted is not None:
        if room.get(wanted, 0) >= workers:
            return Placement(wanted)
        return Placement(wanted, f"spec.gpuProduct {wanted}: its Ready nodes hold "
                                 f"{room.get(wanted, 0)} of {workers} workers × {gpus} GPUs")
    if not room:
        return Placement(None)  # no node carries the label: nothing to keep apart
    fitting = sorted((p for p, n in room.items() if n >= workers),
                     key=lambda p: (free.get(p, 0) < workers, -room[p], p))
    if fitting:
        return Placement(fitting[0])
    holds = ", ".join(f"{p} holds {n}" for p, n in sorted(room.items()))
    return Placement(None, f"no single GPU product has room for {workers} workers × {gpus} "
                           f"GPUs ({holds}); workers of one group never mix GPU models")


def _room(nodes: Iterable[Manifest], gpus: int, held: Mapping[str, int] | None = None
          ) -> dict[str, int]:
    """Workers of `gpus` GPUs each that fit, by product, on Ready schedulable nodes (less
    what `held` says other pods hold there)."""
    room: dict[str, int] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        product = (meta.get("labels") or {}).get(PRODUCT_LABEL)
        if not product or not _usable(node):
            continue
        allocatable = int(parse_or_zero(((node.get("status") or {}).get("allocatable") or {})
                                        .get(GPU_RESOURCE) or 0))
        available = max(0, allocatable - (held or {}).get(meta.get("name", ""), 0))
        room[product] = room.get(product, 0) + available // gpus
    return room


def _usable(node: Manifest) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
