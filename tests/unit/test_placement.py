from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from multiworker.api import names
from multiworker.decide.placement import (
    Holder,
    format_amount,
    gang_waiting_message,
    missing_resources,
    partial_placement_message,
    pod_group_state,
    pod_request,
    resource_holders,
)

from tests.unit.builders import PodBuilder

GPU = "nvidia.com/gpu"
# What kube-scheduler (with Coscheduling) writes into PodScheduled=False.
FIT_ERROR = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
             "available: 1 No preemption victims found for incoming pod.")
REJECTED = "rejected due to timeout after waiting 60s at plugin Coscheduling"
SIBLINGS = ("pre-filter pod b-worker-0 cannot find enough sibling pods, current pods number: 2, "
            "minMember of group: 3")


def worker(index: int, job: str = "b", namespace: str = "ns", gpus: int | str | None = 1,
           node: str | None = None, phase: str = "Pending",
           unschedulable: str | None = None) -> dict[str, Any]:
    pod = PodBuilder(index, job=job).build()
    pod["metadata"]["namespace"] = namespace
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus is not None:
        resources["limits"] = {GPU: str(gpus)}
    pod["spec"] = {"containers": [{"name": "tensorflow", "resources": resources}]}
    if node:
        pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = phase
    if unschedulable:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable", "message": unschedulable}]
    return pod


def running(index: int, job: str, namespace: str = "ns", gpus: int = 1) -> dict[str, Any]:
    return worker(index, job, namespace, gpus=gpus, node="mw-node", phase="Running")


def pod_group(phase: str = "", **status: int) -> dict[str, Any]:
    return {"metadata": {"name": "b-g0"}, "spec": {"minMember": 3},
            "status": {"phase": phase, **status} if phase else {}}


A_HOLDS_THREE = [running(i, "a") for i in range(3)]


@pytest.mark.parametrize(("resource", "amount", "text"), [
    (GPU, Decimal(3), "3"),
    ("cpu", Decimal("0.300"), "0.3"),
    ("memory", Decimal(3 * 2**30), "3Gi"),
    ("memory", Decimal(1536 * 2**20), "1536Mi"),
    ("memory", Decimal(1000), "1000"),
])
def test_format_amount(resource: str, amount: Decimal, text: str) -> None:
    assert format_amount(resource, amount) == text


def _c(cpu: str, sidecar: bool = False) -> dict[str, object]:
    container: dict[str, object] = {"resources": {"requests": {"cpu": cpu}}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


@pytest.mark.parametrize(("spec", "cpu"), [
    # the in-place agent (a native sidecar, 10m) runs beside the trainer: it adds
    ({"containers": [_c("1")], "initContainers": [_c("10m", sidecar=True)]}, "1.010"),
    # an ordinary init container runs alone, beside the sidecars started before it
    ({"containers": [_c("1")], "initContainers": [_c("500m", True), _c("2")]}, "2.5"),
    ({"containers": [_c("1")], "initContainers": [_c("2"), _c("500m", True)]}, "2"),
    ({"containers": [_c("3")], "initContainers": [_c("500m", True), _c("2")]}, "3.5"),
    # the RuntimeClass's overhead, set on the pod by admission
    ({"containers": [_c("1")], "overhead": {"cpu": "250m"}}, "1.25"),
])
def test_pod_request_counts_native_sidecars_and_overhead_as_the_scheduler_does(
    spec: dict[str, object], cpu: str
) -> None:
    """Counted as an init container alone, a sidecar's requests were missed: room() saw room
    for a worker the scheduler then refused (grow, refusal, shrink, again)."""
    assert pod_request({"spec": spec}, "cpu") == Decimal(cpu)


def test_pod_request_counts_limits_alone_and_the_larger_of_init_and_main() -> None:
    pod = {"spec": {
        "containers": [{"resources": {"limits": {GPU: "1"}}},
                       {"resources": {"requests": {GPU: "1"}, "limits": {GPU: "2"}}}],
        "initContainers": [{"resources": {"requests": {GPU: "4"}}}],
    }}
    assert pod_request(pod, GPU) == 4
    pod["spec"]["initContainers"] = [{"resources": {"requests": {GPU: "1"}}}]
    assert pod_request(pod, GPU) == 2
    assert pod_request(pod, "memory") == 0


def test_missing_resources_in_order_of_mention() -> None:
    two_nodes = ("0/2 nodes are available: 1 Insufficient memory, 2 Insufficient "
                 "nvidia.com/gpu.")
    messages = [FIT_ERROR, two_nodes, REJECTED]
    assert missing_resources(messages) == [GPU, "memory"]


def test_resource_holders_group_by_job_and_skip_what_holds_nothing() -> None:
    pods = [
        *A_HOLDS_THREE,
        running(0, "b"),
        worker(1, "b", unschedulable=FIT_ERROR),  # not bound: holds nothing
        worker(2, "c", node="mw-node", phase="Succeeded"),  # finished: holds nothing
        running(0, "d", gpus=0),
        {"metadata": {"name": "notebook", "namespace": "lab"},
         "spec": {"nodeName": "mw-node", "containers": [{"resources": {"limits": {GPU: "2"}}}]},
         "status": {"phase": "Running"}},
    ]
    assert resource_holders(pods, GPU, "ns") == [
        Holder("job a", 3, Decimal(3)),
        Holder("other namespaces", 1, Decimal(2)),  # lab/notebook is another tenant's
        Holder("job b", 1, Decimal(1)),
    ]
    assert resource_holders(pods, GPU, "lab") == [
        Holder("other namespaces", 4, Decimal(4)), Holder("pod notebook", 1, Decimal(2))]


def test_a_message_names_only_the_jobs_own_namespace_and_a_bounded_number_of_holders() -> None:
    """300 foreign jobs gave a 13 KB message naming team-N/... before."""
    foreign = [running(0, f"job-{i}", namespace=f"team-{i}") for i in range(300)]
    own = [running(0, f"mine-{i}") for i in range(8)]
    pods = [worker(0, unschedulable=FIT_ERROR), worker(1, unschedulable=FIT_ERROR)]
    message = partial_placement_message(2, pods, cluster_pods=[*foreign, *own, *pods],
                                        namespace="ns")
    assert message is not None
    assert "team-" not in message
    assert "other namespaces 300 (300 pods)" in message
    assert "4 more holders 4 (4 pods)" in message  # 5 named: other namespaces, 4 of ours
    assert len(message) < 1024


def test_pod_group_state() -> None:
    assert pod_group_state(None) is None
    state = pod_group_state(pod_group("Scheduling", running=1))
    assert state is not None
    assert (state.name, state.phase, state.min_member, state.running) == ("b-g0", "Scheduling",
                                                                           3, 1)


def test_gang_waits_whole_and_names_what_is_missing_and_who_holds_it() -> None:
    pods = [worker(0, unschedulable=REJECTED), worker(1, unschedulable=FIT_ERROR),
            worker(2, unschedulable=REJECTED)]
    message = gang_waiting_message(3, pods, pod_group("Scheduling"), "scheduler-plugins-scheduler",
                                   cluster_pods=[*A_HOLDS_THREE, *pods], namespace="ns")
    assert message == (
        "waiting for the whole group to fit: 0 of 3 workers bound; the scheduler binds none "
        "until all 3 fit at once; not enough free nvidia.com/gpu (the group needs 3; "
        "nvidia.com/gpu is held by job a 3 (3 pods)); worker-1: " + FIT_ERROR
        + " (PodGroup b-g0 Scheduling)"
    )


def test_gang_message_without_a_resource_shortage_quotes_the_scheduler() -> None:
    pods = [worker(0, unschedulable=SIBLINGS), worker(1), worker(2)]
    message = gang_waiting_message(3, pods, pod_group(), "gang")
    assert message is not None
    assert message.endswith(f"worker-0: {SIBLINGS}")
    assert "PodGroup" not in message  # the controller has not set a phase yet


@pytest.mark.parametrize(("pods", "group", "ending"), [
    ([worker(0), worker(1), worker(2)], pod_group(),
     "scheduler 'gang' has not looked at the workers yet — is it running?"),
    ([worker(0)], pod_group("Pending"), "1 of 3 worker pods exist (PodGroup b-g0 Pending)"),
    ([worker(0), worker(1), worker(2)], None, "its PodGroup does not exist yet"),
])
def test_gang_message_before_the_scheduler_has_a_say(
    pods: list[dict[str, Any]], group: dict[str, Any] | None, ending: str
) -> None:
    message = gang_waiting_message(3, pods, group, "gang")
    assert message is not None
    assert message.startswith("waiting for the whole group to fit: 0 of 3 workers bound")
    assert message.endswith(ending)


def test_no_gang_message_once_every_worker_is_bound() -> None:
    pods = [running(i, "b") for i in range(3)]
    assert gang_waiting_message(3, pods, pod_group("Running", running=3), "gang") is None


def test_partial_placement_says_which_job_holds_what() -> None:
    pods = [running(0, "b"), worker(1, unschedulable=FIT_ERROR), worker(2, unschedulable=FIT_ERROR)]
    message = partial_placement_message(3, pods, cluster_pods=[*A_HOLDS_THREE, *pods],
                                        namespace="ns")
    assert message == (
        "2 of 3 workers cannot be scheduled (worker-1: " + FIT_ERROR + "); "
        "1 placed worker of this job waits for them, holding 1 nvidia.com/gpu; "
        "nvidia.com/gpu is held by job a 3 (3 pods), job b 1 (1 pod); "
        "gang scheduling (spec.gang.enabled) would hold nothing until all fit"
    )


def test_partial_placement_without_holders_or_placed_workers() -> None:
    pods = [worker(i, gpus=8, unschedulable=FIT_ERROR) for i in range(2)]
    message = partial_placement_message(2, pods)
    assert message is not None
    assert "placed worker" not in message
    assert "no running pod holds nvidia.com/gpu" in message


def test_partial_placement_counts_several_placed_workers() -> None:
    pods = [running(0, "b", gpus=2), running(1, "b", gpus=2), worker(2, gpus=2,
                                                                   unschedulable=FIT_ERROR)]
    message = partial_placement_message(3, pods)
    assert message is not None
    assert "2 placed workers of this job wait for them, holding 4 nvidia.com/gpu" in message


def test_no_partial_placement_message_while_nothing_is_unschedulable() -> None:
    assert partial_placement_message(3, [running(0, "b"), worker(1), worker(2)]) is None


def test_long_scheduler_messages_are_clipped() -> None:
    pods = [worker(i, unschedulable="x" * 1000) for i in range(3)]
    message = gang_waiting_message(3, pods, pod_group(), "gang")
    assert message is not None
    assert message.endswith("...")
    assert len(message) < 500


def test_worker_names_come_from_the_index_label() -> None:
    pod = worker(2, unschedulable=FIT_ERROR)
    assert pod["metadata"]["labels"][names.LABEL_WORKER_INDEX] == "2"
    message = partial_placement_message(3, [pod])
    assert message is not None
    assert "(worker-2: " in message
