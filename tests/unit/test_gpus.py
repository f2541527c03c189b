"""One GPU product per group: which product a group goes to, and why it cannot go anywhere."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from multiworker.decide.gpus import GpuRequestError, gpus_per_worker, held_gpus, place
from multiworker.decide.quantity import parse, parse_or_zero


def node(product: str | None, gpus: int, ready: bool = True, cordoned: bool = False
         ) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": f"n-{product}-{gpus}", "labels": labels},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


A100 = [node("A100", 4), node("A100", 4)]  # holds 4 workers of 2 GPUs
T4 = [node("T4", 8), node("T4", 8), node("T4", 4)]  # holds 10


@pytest.mark.parametrize(("nodes", "workers", "gpus", "wanted", "product", "problem"), [
    (A100 + T4, 4, 2, None, "T4", None),  # both fit: the one with more room
    (A100 + T4, 10, 2, None, "T4", None),
    (A100 + T4, 4, 2, "A100", "A100", None),  # the spec decides
    (A100 + T4, 5, 2, "A100", "A100", "spec.gpuProduct A100: its Ready nodes hold 4 of 5"),
    (A100 + T4, 11, 2, None, None, ("no single GPU product has room for 11 workers × 2 GPUs "
                                   "(A100 holds 4, T4 holds 10)")),
    ([node(None, 8)], 4, 2, None, None, None),  # no labels: nothing to keep apart
    (A100 + T4, 4, 0, None, None, None),  # a CPU job goes anywhere
    ([node("A100", 8, ready=False), node("T4", 2, cordoned=True), node("T4", 2)], 1, 2, None,
     "T4", None),  # NotReady and cordoned nodes hold nothing
])
def test_place(nodes: list[dict[str, Any]], workers: int, gpus: int, wanted: str | None,
               product: str | None, problem: str | None) -> None:
    placement = place(nodes, workers, gpus, wanted)
    assert placement.product == product
    if problem is None:
        assert placement.problem is None
    else:
        assert placement.problem is not None and placement.problem.startswith(problem)


def pod(node: str | None, gpus: int, owner: str = "other", phase: str = "Running"
        ) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": [{"uid": owner, "controller": True}]},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def named(name: str, product: str, gpus: int) -> dict[str, Any]:
    found = node(product, gpus)
    found["metadata"]["name"] = name
    return found


@pytest.mark.parametrize(("held", "product"), [
    ({}, "T4"),  # nothing held: the most capacity
    ({"t1": 8, "t2": 8}, "A100"),  # T4 taken by other pods: A100's free GPUs hold the group
    ({"t1": 8, "t2": 8, "a1": 4}, "T4"),  # neither free: the most capacity, and wait there
])
def test_place_prefers_a_product_whose_free_gpus_hold_the_group(
    held: dict[str, int], product: str
) -> None:
    nodes = [named("a1", "A100", 4), named("a2", "A100", 4),
             named("t1", "T4", 8), named("t2", "T4", 8)]
    assert place(nodes, 3, 2, None, held).product == product


def test_held_gpus_counts_other_pods_that_hold_their_node() -> None:
    pods = [pod("n1", 2), pod("n1", 1), pod("n2", 4, owner="job"), pod(None, 8),
            pod("n2", 3, phase="Succeeded"), pod("n3", 1, phase="Pending")]
    assert held_gpus(pods, "job") == {"n1": 3, "n3": 1}


def test_gpus_per_worker_sums_containers_limits_or_requests() -> None:
    template = {"spec": {"containers": [
        {"name": "tensorflow", "resources": {"limits": {"nvidia.com/gpu": 2}}},
        {"name": "side", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
        {"name": "plain"}]}}
    assert gpus_per_worker(template) == 3


def one(amount: Any) -> dict[str, Any]:
    return {"spec": {"containers": [
        {"name": "tensorflow", "resources": {"limits": {"nvidia.com/gpu": amount}}}]}}


@pytest.mark.parametrize(("amount", "gpus"), [
    ("1", 1), ("1.0", 1), (1, 1), ("2k", 2000), ("1e1", 10), ("4000m", 4), ("0", 0),
])
def test_gpu_quantities_parse_as_kubernetes_parses_them(amount: Any, gpus: int) -> None:
    assert gpus_per_worker(one(amount)) == gpus


@pytest.mark.parametrize(("amount", "problem"), [
    ("0.5", "nvidia.com/gpu 0.5 is not a whole number of GPUs"),
    ("1500m", "nvidia.com/gpu 1500m is not a whole number of GPUs"),
    ("one", "nvidia.com/gpu 'one' is not a Kubernetes quantity"),
])
def test_a_fractional_or_malformed_gpu_request_is_a_named_spec_error(
    amount: str, problem: str,
) -> None:
    with pytest.raises(GpuRequestError) as refused:
        gpus_per_worker(one(amount))
    assert str(refused.value) == f"spec.template.spec.containers[tensorflow]: {problem}" + (
        " (a GPU is not divisible)" if "whole" in problem else "")


@pytest.mark.parametrize(("text", "value"), [
    ("1", Decimal(1)), ("500m", Decimal("0.5")), ("2Gi", Decimal(2 * 2**30)),
    ("1.5", Decimal("1.5")), ("3k", Decimal(3000)), (2, Decimal(2)),
])
def test_quantity(text: str | int, value: Decimal) -> None:
    assert parse(text) == value == parse_or_zero(text)


def test_a_malformed_quantity_is_an_error_or_zero_where_it_only_informs() -> None:
    with pytest.raises(ValueError, match="'nonsense' is not a Kubernetes quantity"):
        parse("nonsense")
    assert parse_or_zero("nonsense") == 0
