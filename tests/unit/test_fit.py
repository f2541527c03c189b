"""decide/fit.may_host: the nodes that can never hold a worker, node affinity's required terms
included (an elastic group's room must not count nodes the scheduler would refuse)."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.decide.fit import may_host


def node(name: str = "n1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize(("pod_spec", "labels", "expected"), [
    ({}, {}, True),
    (required({"matchExpressions": [expr("zone", "In", "a", "b")]}), {"zone": "a"}, True),
    (required({"matchExpressions": [expr("zone", "In", "a", "b")]}), {"zone": "c"}, False),
    (required({"matchExpressions": [expr("zone", "In", "a")]}), {}, False),
    (required({"matchExpressions": [expr("zone", "NotIn", "a")]}), {}, True),
    (required({"matchExpressions": [expr("zone", "NotIn", "a")]}), {"zone": "a"}, False),
    (required({"matchExpressions": [expr("gpu", "Exists")]}), {"gpu": ""}, True),
    (required({"matchExpressions": [expr("gpu", "DoesNotExist")]}), {"gpu": ""}, False),
    (required({"matchExpressions": [expr("mem", "Gt", "40")]}), {"mem": "80"}, True),
    (required({"matchExpressions": [expr("mem", "Lt", "40")]}), {"mem": "80"}, False),
    (required({"matchExpressions": [expr("mem", "Gt", "40")]}), {"mem": "lots"}, False),
    # Terms are ORed, expressions within one ANDed; an empty term matches nothing.
    (required({"matchExpressions": [expr("zone", "In", "x")]},
              {"matchExpressions": [expr("zone", "In", "a")]}), {"zone": "a"}, True),
    (required({"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "Exists")]}),
     {"zone": "a"}, False),
    (required({}), {"zone": "a"}, False),
    (required({"matchFields": [expr("metadata.name", "In", "n1")]}), {}, True),
    (required({"matchFields": [expr("metadata.name", "NotIn", "n1")]}), {}, False),
])
def test_a_node_may_host_a_worker_only_where_its_required_node_affinity_matches(
    pod_spec: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert may_host(node(**labels), pod_spec) is expected
