"""What the watch-fed caches keep of each kind, from a listed object and straight from a
watch event's bytes.

A pod watch event is ~6 KB of JSON, of which a pass reads a tenth. Decoding all of it into
Python objects and then keeping the tenth was most of the pod informer's CPU (~23 us of ~40
per event on an idle core here; the pod informer is the operator's largest cost per pod,
bench_scale.py). msgspec decodes into a declared shape and skips everything else without
building it (~9 us, managedFields included). An event the shape cannot take (an ERROR event,
a field of an unexpected type) is decoded whole and slimmed instead: the same result, slower.
Keeping only these fields also bounds memory: a cache of 8,000 pods must not keep their
commands, env, volumes or users' annotations (up to 256 KiB each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import msgspec
from pydantic_core import from_json

from multiworker.api import names

Manifest = dict[str, Any]


def slim(obj: Manifest) -> Manifest:
    """Drop what no pass reads and memory would pay for (managedFields, last-applied)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items()
                               if k != "kubectl.kubernetes.io/last-applied-configuration"}
    return {**obj, "metadata": meta}


# --- pods: as observe.py and placement.py read them ---

class _PodMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    ownerReferences: list[Any]
    creationTimestamp: str
    deletionTimestamp: str
    deletionGracePeriodSeconds: int
    annotations: dict[str, str]  # only the operator's own are kept


class _Container(TypedDict, total=False):
    name: str
    resources: dict[str, Any]
    restartPolicyRules: list[Any]


class _PodSpec(TypedDict, total=False):
    nodeName: str
    schedulerName: str
    containers: list[_Container]
    initContainers: list[_Container]


class _ContainerStatus(TypedDict, total=False):
    name: str
    state: dict[str, Any]
    lastState: dict[str, Any]
    restartCount: int
    imageID: str
    ready: bool


class _PodStatus(TypedDict, total=False):
    phase: str
    reason: str
    message: str
    hostIP: str
    podIP: str
    conditions: list[Any]
    containerStatuses: list[_ContainerStatus]
    initContainerStatuses: list[_ContainerStatus]


class _Pod(TypedDict, total=False):
    metadata: _PodMeta
    spec: _PodSpec
    status: _PodStatus


class _PodEvent(TypedDict, total=False):
    type: str
    object: _Pod


_CONTAINERS = ("containers", "initContainers")
_CONTAINER_STATUSES = ("containerStatuses", "initContainerStatuses")
# The shapes above are the one list of what is kept; slim_pod keeps the same of a dict.
_POD_META = tuple(k for k in _PodMeta.__annotations__ if k != "annotations")
_POD_STATUS = tuple(k for k in _PodStatus.__annotations__ if k not in _CONTAINER_STATUSES)
_CONTAINER_STATUS = tuple(_ContainerStatus.__annotations__)


def slim_pod(pod: Manifest) -> Manifest:
    """A pod as observe.py and placement.py read it, and nothing more. Metadata: identity,
    labels, owners, times and the operator's own annotations; spec: node, scheduler, the
    containers' names, resources and restart rules; status: phase, reason, addresses,
    conditions and each container's state, last state, restart count and image."""
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    kept_meta: Manifest = {k: meta[k] for k in _POD_META if k in meta}
    ours = _ours(meta.get("annotations"))
    if ours:
        kept_meta["annotations"] = ours
    kept_spec: Manifest = {k: spec[k] for k in ("nodeName", "schedulerName") if k in spec}
    for key in _CONTAINERS:
        if key in spec:
            kept_spec[key] = [_container(c) for c in spec[key]]
    kept_status: Manifest = {k: status[k] for k in _POD_STATUS if k in status}
    for key in _CONTAINER_STATUSES:
        if key in status:
            kept_status[key] = [{k: c[k] for k in _CONTAINER_STATUS if k in c}
                                for c in status[key]]
    return {"metadata": kept_meta, "spec": kept_spec, "status": kept_status}


def _ours(annotations: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (annotations or {}).items() if k.startswith(f"{names.GROUP}/")}


def _container(c: Manifest) -> Manifest:
    return {"name": c.get("name"), "resources": c.get("resources") or {},
            **({"restartPolicyRules": c["restartPolicyRules"]}
               if c.get("restartPolicyRules") else {})}


def _finish_pod(pod: Manifest) -> Manifest:
    """A pod as msgspec decoded it into _Pod, made exactly what slim_pod makes of it."""
    meta = pod.setdefault("metadata", {})
    if "annotations" in meta:
        ours = _ours(meta.pop("annotations"))
        if ours:
            meta["annotations"] = ours
    spec = pod.setdefault("spec", {})
    for key in _CONTAINERS:
        if key in spec:
            spec[key] = [_container(c) for c in spec[key]]
    pod.setdefault("status", {})
    return pod


# --- nodes: as lost-node detection, GPU placement and in-place restarts read them ---

class _NodeMeta(TypedDict, total=False):
    name: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    deletionTimestamp: str


class _NodeSpec(TypedDict, total=False):
    taints: list[Any]
    unschedulable: bool


class _NodeInfo(TypedDict, total=False):
    kubeletVersion: str


class _NodeStatus(TypedDict, total=False):
    conditions: list[Any]
    allocatable: dict[str, Any]
    nodeInfo: _NodeInfo
    declaredFeatures: list[Any]


class _Node(TypedDict, total=False):
    metadata: _NodeMeta
    spec: _NodeSpec
    status: _NodeStatus


class _NodeEvent(TypedDict, total=False):
    type: str
    object: _Node


def slim_node(node: Manifest) -> Manifest:
    """A node as lost-node detection, GPU placement and in-place restarts read it: labels,
    taints, whether it is cordoned, conditions, allocatable resources, its kubelet's version and
    declared features."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, \
        node.get("status") or {}
    return {"metadata": {k: meta[k] for k in _NodeMeta.__annotations__ if k in meta},
            "spec": {"taints": spec.get("taints", []),
                     "unschedulable": spec.get("unschedulable", False)},
            "status": {"conditions": status.get("conditions", []),
                       "allocatable": status.get("allocatable", {}),
                       "nodeInfo": {"kubeletVersion": (status.get("nodeInfo") or {})
                                    .get("kubeletVersion", "")},
                       "declaredFeatures": status.get("declaredFeatures") or []}}


# --- decoding watch events ---

Decoder = Callable[[bytes], Manifest]


def whole(slim_object: Callable[[Manifest], Manifest]) -> Decoder:
    """A decoder of whole events: the object slimmed (not an ERROR's Status, nor a
    BOOKMARK's bare metadata)."""
    def decode(line: bytes) -> Manifest:
        event: Manifest = from_json(line)
        if event.get("type") not in ("ERROR", "BOOKMARK") and event.get("object") is not None:
            event["object"] = slim_object(event["object"])
        return event
    return decode


def shaped(event_type: Any, finish: Callable[[Manifest], Manifest],
           slim_object: Callable[[Manifest], Manifest]) -> Decoder:
    """A decoder into `event_type`'s shape, then `finish`ed; whole and `slim_object`ed where
    the shape cannot take the event."""
    decoder = msgspec.json.Decoder(event_type)
    fallback = whole(slim_object)

    def decode(line: bytes) -> Manifest:
        try:
            event: Manifest = decoder.decode(line)
        except msgspec.DecodeError:  # a ValidationError too
            return fallback(line)
        if event.get("type") in ("ERROR", "BOOKMARK"):
            return fallback(line)
        if "object" in event:
            event["object"] = finish(event["object"])
        return event
    return decode


@dataclass(frozen=True)
class Shape:
    """What a cache keeps of one kind: `slim` makes it of a listed object, `decode` of a watch
    event's bytes (the event, its object already slim)."""

    slim: Callable[[Manifest], Manifest]
    decode: Decoder

    @classmethod
    def of(cls, slim_object: Callable[[Manifest], Manifest]) -> Shape:
        """A kind decoded whole, then slimmed (jobs, Leases: few events)."""
        return cls(slim_object, whole(slim_object))


OBJECT = Shape.of(slim)
POD = Shape(slim_pod, shaped(_PodEvent, _finish_pod, slim_pod))
NODE = Shape(slim_node, shaped(_NodeEvent, slim_node, slim_node))  # few events: slim again
