"""Pure: one GPU product per group. MultiWorkerMirroredStrategy runs in lockstep, so a group
that mixes GPU models trains at the pace of the slowest (or fails on a kernel one model lacks);
where nodes carry NVIDIA's product label, every worker of a group goes to one product.

The choice is by capacity (allocatable GPUs of Ready nodes), made for each new group; what
other pods use right now is left to the scheduler, whose verdict shows as usual.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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


def place(nodes: Iterable[Manifest], workers: int, gpus: int, wanted: str | None) -> Placement:
    """The product for a group of `workers` × `gpus`: `wanted` if given (checked), else the
    product with the most room among those that can hold the whole group."""
    if gpus <= 0:
        return Placement(None)
    room = _room(nodes, gpus)
    if wanted is not None:
        if room.get(wanted, 0) >= workers:
            return Placement(wanted)
        return Placement(wanted, f"spec.gpuProduct {wanted}: its Ready nodes hold "
                                 f"{room.get(wanted, 0)} of {workers} workers × {gpus} GPUs")
    if not room:
        return Placement(None)  # no node carries the label: nothing to keep apart
    fitting = sorted((p for p, n in room.items() if n >= workers), key=lambda p: (-room[p], p))
    if fitting:
        return Placement(fitting[0])
    holds = ", ".join(f"{p} holds {n}" for p, n in sorted(room.items()))
    return Placement(None, f"no single GPU product has room for {workers} workers × {gpus} "
                           f"GPUs ({holds}); workers of one group never mix GPU models")


def _room(nodes: Iterable[Manifest], gpus: int) -> dict[str, int]:
    """Workers of `gpus` GPUs each that fit, by product, on Ready schedulable nodes."""
    room: dict[str, int] = {}
    for node in nodes:
        product = ((node.get("metadata") or {}).get("labels") or {}).get(PRODUCT_LABEL)
        if not product or not _usable(node):
            continue
        allocatable = int(parse_or_zero(((node.get("status") or {}).get("allocatable") or {})
                                        .get(GPU_RESOURCE) or 0))
        room[product] = room.get(product, 0) + allocatable // gpus
    return room


def _usable(node: Manifest) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
