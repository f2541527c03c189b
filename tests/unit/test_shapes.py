"""Watch events decoded straight into what the caches keep (shapes.py): whatever the API server
writes, a pod's or node's event decodes to exactly what slimming the whole event gives."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from multiworker.clients.shapes import NODE, POD, slim_node, slim_pod

from tests.unit.test_informer import kubelet_pod

texts = st.text(max_size=12) | st.sampled_from(["multiworker.dev/x", '"', "\\", "}"])
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10)
# Mostly what the API server writes, sometimes a value of another type (the shape refuses it
# and the event is decoded whole), always with fields no pass reads.
def typed(kind: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(kind, kind, kind, json_values)


def extra(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda d: st.dictionaries(texts, json_values, max_size=2).map(lambda x: {**x, **d}))


labels = st.dictionaries(texts, texts, max_size=3)
annotations = st.dictionaries(texts | st.sampled_from(["multiworker.dev/a", "other/b"]),
                              texts, max_size=3)
containers = st.lists(extra(name=typed(texts), resources=typed(st.dictionaries(
    texts, json_values, max_size=2)), restartPolicyRules=typed(st.lists(json_values,
                                                                          max_size=2))),
    max_size=2)
container_statuses = st.lists(extra(
    name=typed(texts), state=typed(st.dictionaries(texts, json_values, max_size=2)),
    lastState=typed(st.dictionaries(texts, json_values, max_size=2)),
    restartCount=typed(st.integers(0, 9)), imageID=typed(texts), ready=typed(st.booleans())),
    max_size=2)
pods = extra(
    metadata=extra(name=typed(texts), namespace=typed(texts), uid=typed(texts),
                   resourceVersion=typed(st.integers(0).map(str)), labels=typed(labels),
                   annotations=typed(annotations), ownerReferences=typed(st.lists(
                       json_values, max_size=2)),
                   creationTimestamp=typed(texts), deletionTimestamp=typed(texts),
                   deletionGracePeriodSeconds=typed(st.integers(0, 60)),
                   managedFields=st.lists(json_values, max_size=2)),
    spec=extra(nodeName=typed(texts), schedulerName=typed(texts),
               containers=containers, initContainers=containers),
    status=extra(phase=typed(texts), reason=typed(texts), message=typed(texts),
                 hostIP=typed(texts), podIP=typed(texts),
                 conditions=typed(st.lists(json_values, max_size=2)),
                 containerStatuses=container_statuses, initContainerStatuses=container_statuses))
nodes = extra(
    metadata=extra(name=typed(texts), uid=typed(texts), resourceVersion=typed(texts),
                   labels=typed(labels), deletionTimestamp=typed(texts),
                   annotations=annotations),
    spec=extra(taints=typed(st.lists(json_values, max_size=2)),
               unschedulable=typed(st.booleans())),
    status=extra(conditions=typed(st.lists(json_values, max_size=2)),
                 allocatable=typed(st.dictionaries(texts, texts, max_size=2)),
                 nodeInfo=typed(extra(kubeletVersion=typed(texts))),
                 declaredFeatures=typed(st.lists(texts, max_size=2))))
kinds = st.sampled_from(["ADDED", "MODIFIED", "DELETED"])


def line(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def whole_then_slim(data: bytes, slim: Any) -> dict[str, Any]:
    event = json.loads(data)
    return {**event, "object": slim(event["object"])}


@settings(deadline=None, database=None, max_examples=300)
@given(kind=kinds, pod=pods)
def test_a_pod_event_decodes_to_what_slimming_it_whole_gives(kind: str, pod: Any) -> None:
    try:
        expected = whole_then_slim(line(kind, pod), slim_pod)
    except (AttributeError, TypeError):
        return  # a shape no API server writes (containers that are not objects): slim_pod's
    assert POD.decode(line(kind, pod)) == expected


@settings(deadline=None, database=None, max_examples=200)
@given(kind=kinds, node=nodes)
def test_a_node_event_decodes_to_what_slimming_it_whole_gives(kind: str, node: Any) -> None:
    try:
        expected = whole_then_slim(line(kind, node), slim_node)
    except (AttributeError, TypeError):
        return
    assert NODE.decode(line(kind, node)) == expected


def test_a_kubelet_pod_keeps_only_what_passes_read() -> None:
    pod = kubelet_pod()
    decoded = POD.decode(line("MODIFIED", pod))
    assert decoded == {"type": "MODIFIED", "object": slim_pod(pod)}
    assert decoded["object"]["metadata"]["annotations"] == {
        "multiworker.dev/trainer-container": "tensorflow"}


def test_errors_and_bookmarks_pass_whole() -> None:
    """A watch that expired answers a Status (its `status` a string): the informer reads its
    code; a bookmark only its resourceVersion."""
    expired = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "too old resource version", "reason": "Expired", "code": 410}
    assert POD.decode(line("ERROR", expired)) == {"type": "ERROR", "object": expired}
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "12", "annotations": {"k8s.io/initial-events-end": "true"}}}
    assert POD.decode(line("BOOKMARK", bookmark)) == {"type": "BOOKMARK", "object": bookmark}
