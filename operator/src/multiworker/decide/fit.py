"""Pure: whether a pod could be scheduled to a node, as far as the operator needs to know it —
its nodeSelector (the GPU product's included), tolerations of NoSchedule/NoExecute taints, a
cordon, and enough allocatable GPUs. Node affinity and the other resources stay the
scheduler's: this only rules nodes out that can never hold the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multiworker.decide.gpus import GPU_RESOURCE, GpuRequestError, gpus_per_worker
from multiworker.decide.quantity import parse_or_zero

_TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def may_host(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """Whether `node` could ever hold a pod of `pod_spec` (a PodSpec dict)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    if not all(any(_tolerates(t, taint) for t in tolerations)
               for taint in spec.get("taints") or [] if taint.get("effect") in _TAINT_EFFECTS):
        return False
    try:
        gpus = gpus_per_worker({"spec": pod_spec})
    except GpuRequestError:
        gpus = 0  # a job asking for it fails before any pod is made (creation._place_group)
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE) or 0
    return gpus == 0 or parse_or_zero(allocatable) >= gpus


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and \
        (toleration.get("value") or "") == (taint.get("value") or "")
