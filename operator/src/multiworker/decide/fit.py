"""Pure: whether a pod could be scheduled to a node, as far as the operator needs to know it —
its nodeSelector (the GPU product's included), the required terms of its node affinity,
tolerations of NoSchedule/NoExecute taints, a cordon, and enough allocatable GPUs. Preferences,
pod (anti-)affinity, topology spread and the other resources stay the scheduler's: this only
rules nodes out that can never hold the pod.
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
    if not _required_affinity_allows(node, pod_spec):
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


def _required_affinity_allows(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: any one of its terms matches (a term:
    all of its expressions and fields; an empty term matches nothing, as the scheduler has)."""
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    fields = {"metadata.name": metadata.get("name")}
    return any((term.get("matchExpressions") or term.get("matchFields"))
               and all(_matches(e, labels) for e in term.get("matchExpressions") or [])
               and all(_matches(e, fields) for e in term.get("matchFields") or [])
               for term in terms)


def _matches(expression: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    key, operator = str(expression.get("key")), expression.get("operator")
    wanted = [str(v) for v in expression.get("values") or []]
    value = values.get(key)
    if operator == "In":
        return value is not None and str(value) in wanted
    if operator == "NotIn":
        return value is None or str(value) not in wanted
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(wanted) == 1:
        try:
            have, bound = int(str(value)), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
