"""Kueue admission: the pure rules (decide/queueing.py) as tables, then the step
(reconcile/queueing.py) against the in-memory cluster, Kueue played by hand."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from multiworker.api import names
from multiworker.decide.queueing import (
    FINALIZER,
    QUEUE_LABEL,
    Admission,
    Priority,
    desired_workload,
    flavor_fields,
    orphaned,
    priority_of,
    quota_released,
    read_workload,
    with_flavor_fields,
)
from multiworker.reconcile.context import Options
from multiworker.reconcile.reconcile import Outcome, reconcile

from tests.unit.builders import NAMESPACE, T0, job_body
from tests.unit.fake_cluster import FakeCluster

Manifest = dict[str, Any]
PODS = ["demo-worker-0", "demo-worker-1", "demo-worker-2"]
KUEUE = Options(kueue=True)


def cond(type_: str, status: str, reason: str = "R", message: str = "") -> Manifest:
    return {"type": type_, "status": status, "reason": reason, "message": message}


ADMISSION = {"clusterQueue": "gpus", "podSetAssignments": [
    {"name": "workers", "flavors": {"nvidia.com/gpu": "a100", "cpu": "default"}}]}


# --- the rules ---


@pytest.mark.parametrize(("status", "admission", "reason"), [
    ({}, Admission.PENDING, "Pending"),
    ({"conditions": [cond("QuotaReserved", "False", "Inadmissible",
                          "LocalQueue nope doesn't exist")]}, Admission.PENDING, "Inadmissible"),
    ({"admission": ADMISSION, "conditions": [cond("QuotaReserved", "True"),
                                              cond("Admitted", "True", "Admitted")]},
     Admission.ADMITTED, "Admitted"),
    # Quota reserved, admission checks still pending: not yet.
    ({"admission": ADMISSION, "conditions": [cond("QuotaReserved", "True"),
                                              cond("Admitted", "False", "Checks")]},
     Admission.PENDING, "R"),
    ({"admission": ADMISSION, "conditions": [
        cond("QuotaReserved", "True"), cond("Admitted", "True"),
        cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload")]},
     Admission.EVICTED, "Preempted"),
    # Evicted and its quota returned: waiting again.
    ({"conditions": [cond("QuotaReserved", "False", "Pending", "evicted"),
                     cond("Evicted", "True", "Preempted")]}, Admission.PENDING, "Pending"),
    ({"conditions": [cond("Finished", "True", "Succeeded")]}, Admission.FINISHED, "Succeeded"),
])
def test_what_kueue_says_of_a_workload(status: Manifest, admission: Admission,
                                       reason: str) -> None:
    state = read_workload({"metadata": {}, "status": status})
    assert (state.admission, state.reason) == (admission, reason)


def test_an_admitted_workload_names_its_cluster_queue_and_flavors() -> None:
    state = read_workload({"status": {"admission": ADMISSION, "conditions": [
        cond("QuotaReserved", "True"), cond("Admitted", "True")]}})
    assert state.cluster_queue == "gpus"
    assert state.flavors == {"nvidia.com/gpu": "a100", "cpu": "default"}


@pytest.mark.parametrize(("reason", "requeued"), [
    ("Preempted", "True"), ("NodeFailures", "True"), ("Deactivated", "False"),
    ("PodsReadyTimeout", "False")])
def test_returning_the_quota_clears_the_admission_as_kueues_own_controllers_do(
        reason: str, requeued: str) -> None:
    workload = {"metadata": {"generation": 2}, "status": {"admission": ADMISSION, "conditions": [
        cond("QuotaReserved", "True"), cond("Admitted", "True"),
        cond("Evicted", "True", reason, "why")]}}
    status = quota_released(workload, T0)
    got = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert "admission" not in status
    assert got["QuotaReserved"] == ("False", "Pending")
    assert got["Admitted"] == ("False", "NoReservation")
    assert got["Requeued"] == (requeued, reason)
    assert got["Evicted"] == ("True", reason)  # Kueue clears it when it admits again


def test_flavors_merge_their_node_labels_and_tolerations_into_every_pod() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    fields = flavor_fields([
        {"spec": {"nodeLabels": {"gpu.product": "a100"}, "tolerations": [toleration]}},
        {"spec": {"nodeLabels": {"gpu.product": "other", "zone": "a"},
                  "tolerations": [toleration]}},
    ])
    assert fields.node_labels == {"gpu.product": "a100", "zone": "a"}
    assert fields.tolerations == (toleration,)
    pod = with_flavor_fields({"spec": {"nodeSelector": {"disk": "ssd"}}}, fields)
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd", "gpu.product": "a100", "zone": "a"}
    assert pod["spec"]["tolerations"] == [toleration]


@pytest.mark.parametrize(("labels", "spec", "expected"), [
    ({}, {}, None),
    ({"kueue.x-k8s.io/priority-class": "high"}, {"priorityClassName": "low"},
     Priority("kueue.x-k8s.io", "WorkloadPriorityClass", "high")),
    ({}, {"priorityClassName": "low"}, Priority("scheduling.k8s.io", "PriorityClass", "low")),
])
def test_a_workloads_priority_comes_from_kueues_label_first(
        labels: dict[str, str], spec: Manifest, expected: Priority | None) -> None:
    assert priority_of(labels, spec) == expected


def workload_for(workers: int, queue: str = "team") -> Manifest:
    return desired_workload(job="demo", namespace="ns", uid="u1", owner={"uid": "u1"},
                            labels={}, queue=queue, workers=workers,
                            template={"metadata": {"labels": {"a": "b"}},
                                      "spec": {"containers": [{"name": "c"}]}},
                            priority=None, priority_value=None)


def test_a_workload_is_named_by_what_kueue_cannot_change_in_place() -> None:
    three, four = workload_for(3), workload_for(4)
    assert three["spec"]["podSets"][0]["count"] == 3
    assert three["spec"]["podSets"][0]["template"]["metadata"] == {"labels": {"a": "b"}}
    assert three["metadata"]["finalizers"] == [FINALIZER]
    assert three["metadata"]["name"] == workload_for(3)["metadata"]["name"]
    assert three["metadata"]["name"] != four["metadata"]["name"]
    assert three["metadata"]["name"] != workload_for(3, "other")["metadata"]["name"]


# --- the step, Kueue played by hand ---


def queued(**spec: Any) -> FakeCluster:
    body = job_body(**spec)
    body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
    cluster = FakeCluster(body)
    cluster.objects["a100"] = {"metadata": {"name": "a100"}, "spec": {
        "nodeLabels": {"gpu.product": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
    return cluster


def step(cluster: FakeCluster, seconds: float = 1, options: Options = KUEUE) -> Outcome:
    cluster.now += timedelta(seconds=seconds)
    return reconcile(cluster, NAMESPACE, "demo", cluster.now, options=options)


def queued_condition(cluster: FakeCluster) -> tuple[str, str, str]:
    c = next(c for c in cluster.status["conditions"] if c["type"] == "Queued")
    return c["status"], c["reason"], c["message"]


def the_workload(cluster: FakeCluster) -> Manifest:
    assert len(cluster.workloads) == 1, list(cluster.workloads)
    return next(iter(cluster.workloads.values()))


def admit(cluster: FakeCluster) -> None:
    w = the_workload(cluster)
    w["status"] = {"admission": {"clusterQueue": "gpus", "podSetAssignments": [
        {"name": "workers", "flavors": {"nvidia.com/gpu": "a100"}}]},
        "conditions": [cond("QuotaReserved", "True", "QuotaReserved"),
                       cond("Admitted", "True", "Admitted")]}
    w["metadata"]["resourceVersion"] = str(int(w["metadata"]["resourceVersion"]) + 1)


def evict(cluster: FakeCluster, reason: str = "Preempted") -> None:
    w = the_workload(cluster)
    w["status"]["conditions"] += [
        cond("Evicted", "True", reason, "Preempted to accommodate a workload (UID: x)"),
        cond("Preempted", "True", "InClusterQueue", "by workload urgent/mwj-urgent")]
    w["metadata"]["resourceVersion"] = str(int(w["metadata"]["resourceVersion"]) + 1)


def running() -> FakeCluster:
    """A queued job, admitted, its group running."""
    cluster = queued()
    step(cluster)
    admit(cluster)
    step(cluster)
    cluster.run()
    step(cluster)
    return cluster


def test_a_queued_job_creates_its_workload_and_no_pod_until_admitted() -> None:
    cluster = queued()
    step(cluster)
    w = the_workload(cluster)
    assert w["spec"]["queueName"] == "team" and w["spec"]["podSets"][0]["count"] == 3
    assert w["metadata"]["labels"][names.LABEL_JOB_NAME] == "demo"
    assert w["metadata"]["ownerReferences"][0]["controller"] is True
    assert cluster.pods == {} and cluster.status["phase"] == "Queued"
    w["status"] = {"conditions": [cond("QuotaReserved", "False", "Pending",
                                       "couldn't assign flavors: insufficient quota")]}
    step(cluster)
    cluster.objects["team"] = {"metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}}
    step(cluster)
    status, reason, message = queued_condition(cluster)
    assert (status, reason) == ("True", "Queued")
    assert "LocalQueue team (ClusterQueue gpus)" in message and "insufficient quota" in message
    assert cluster.pods == {}


def test_admitted_the_group_starts_on_the_flavors_nodes() -> None:
    cluster = queued()
    step(cluster)
    admit(cluster)
    step(cluster)
    assert sorted(cluster.pods) == PODS
    pod = cluster.pods[PODS[0]]
    assert pod["spec"]["nodeSelector"]["gpu.product"] == "a100"
    assert pod["spec"]["tolerations"][0]["key"] == "gpu"
    status, reason, message = queued_condition(cluster)
    assert (status, reason) == ("False", "Admitted") and "ClusterQueue gpus" in message
    assert ("Admitted" in {e[1] for e in cluster.events})
    cluster.run()
    step(cluster)
    assert cluster.status["phase"] == "Running"
    ready = {c["type"]: c["status"] for c in the_workload(cluster)["status"]["conditions"]}
    assert ready["PodsReady"] == "True"


def test_evicted_the_group_stops_then_returns_its_quota_and_resumes_when_admitted_again(
) -> None:
    cluster = running()
    evict(cluster)
    step(cluster)
    # Stopped the way a suspended group is: stale now, deleted with its grace period.
    assert cluster.status["groupGeneration"] == 1 and cluster.status["phase"] == "Queued"
    assert queued_condition(cluster)[1] == "Preempted"
    assert "admission" in the_workload(cluster)["status"]  # pods still stopping
    step(cluster)
    assert all("deletionTimestamp" in p["metadata"] for p in cluster.pods.values())
    cluster.finish_deletions()
    step(cluster)
    status = the_workload(cluster)["status"]
    assert "admission" not in status
    got = {c["type"]: c["status"] for c in status["conditions"]}
    assert got["QuotaReserved"] == "False" and got["Requeued"] == "True"
    assert [e[1] for e in cluster.events].count("Preempted") == 1
    assert "Requeued" in {e[1] for e in cluster.events}
    step(cluster)
    assert cluster.pods == {} and cluster.status["phase"] == "Queued"
    admit(cluster)
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "1")
    assert cluster.status["restarts"] == 0  # a preemption spends no restart


def test_a_job_edited_while_queued_replaces_its_workload_never_two() -> None:
    cluster = queued()
    step(cluster)
    first = the_workload(cluster)["metadata"]["name"]
    cluster.set_spec(workers=2)
    step(cluster)
    step(cluster)
    w = the_workload(cluster)
    assert w["metadata"]["name"] != first and w["spec"]["podSets"][0]["count"] == 2


def test_a_job_edited_while_running_stops_before_its_new_workload_is_queued() -> None:
    cluster = running()
    cluster.set_spec(workers=2)
    step(cluster)
    assert len(cluster.workloads) == 1  # the admitted one stays while its pods stop
    assert queued_condition(cluster)[1] == "WorkloadReplaced"
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    step(cluster)
    assert the_workload(cluster)["spec"]["podSets"][0]["count"] == 2
    assert cluster.pods == {}


def test_a_workload_deleted_by_hand_is_created_again_once() -> None:
    cluster = queued()
    step(cluster)
    name = the_workload(cluster)["metadata"]["name"]
    cluster.workloads.clear()
    step(cluster)
    step(cluster)
    assert list(cluster.workloads) == [name]


def test_nothing_is_created_before_the_workloads_are_listed() -> None:
    cluster = queued()
    cluster.workloads_listed = False
    outcome = step(cluster)
    assert cluster.workloads == {} and cluster.pods == {}
    assert outcome.requeue is not None and outcome.requeue <= 1


@pytest.mark.parametrize(("served", "options", "reason"), [
    (True, Options(), "KueueDisabled"), (False, KUEUE, "KueueNotInstalled")])
def test_a_queue_label_without_kueue_says_so_and_starts_nothing(
        served: bool, options: Options, reason: str) -> None:
    cluster = queued()
    cluster.served = served
    outcome = step(cluster, options=options)
    status, got, message = queued_condition(cluster)
    assert (status, got) == ("True", reason) and "team" in message
    assert cluster.pods == {} and cluster.workloads == {}
    assert cluster.status["phase"] == "Queued"
    assert reason in {e[1] for e in cluster.events}
    step(cluster, options=options)
    assert [e[1] for e in cluster.events].count(reason) == 1  # no Event per pass
    if not served:
        assert outcome.requeue is not None and outcome.requeue >= 10  # no hot loop


def test_a_missing_priority_class_is_named() -> None:
    cluster = queued()
    cluster.job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    step(cluster)
    assert cluster.workloads == {}
    assert "WorkloadPriorityClass urgent does not exist" in queued_condition(cluster)[2]
    cluster.objects["urgent"] = {"metadata": {"name": "urgent"}, "value": 1000}
    step(cluster)
    assert the_workload(cluster)["spec"]["priority"] == 1000


def test_a_finished_job_finishes_its_workload_then_lets_it_go() -> None:
    cluster = running()
    cluster.exit(0, 0)
    step(cluster)
    assert cluster.status["phase"] == "Succeeded"
    step(cluster)
    cluster.finish_deletions()  # the workers still running when the chief finished stop
    step(cluster)
    got = {c["type"]: (c["status"], c["reason"])
           for c in the_workload(cluster)["status"]["conditions"]}
    assert got["Finished"] == ("True", "Succeeded")
    step(cluster)
    assert the_workload(cluster)["metadata"]["finalizers"] == []


@pytest.mark.parametrize("how", ["chief done first", "failed, no restart left"])
def test_the_quota_goes_back_only_once_no_pod_of_the_job_runs(how: str) -> None:
    """Reproduced: phase Failed, the Workload Finished and its finalizer gone, while two
    workers still ran their grace period, holding their GPUs: Kueue admits another workload
    onto them."""
    cluster = running()
    if how == "chief done first":
        cluster.exit(0, 0)
    else:
        cluster.job["spec"]["restartPolicy"] = {"maxRestarts": 0}
        cluster.exit(1, 1)
    for _ in range(3):
        step(cluster)
    assert cluster.status["phase"] in ("Succeeded", "Failed")
    running_pods = [n for n, pod in cluster.pods.items()
                    if pod["status"].get("phase") == "Running"]
    assert running_pods  # deleted, in their grace period
    workload = the_workload(cluster)
    assert "Finished" not in {c["type"] for c in workload["status"].get("conditions", [])}
    assert workload["metadata"]["finalizers"], workload["metadata"]
    cluster.finish_deletions()
    step(cluster)
    step(cluster)
    assert the_workload(cluster)["metadata"]["finalizers"] == []


def test_a_job_without_the_label_never_touches_kueue() -> None:
    cluster = FakeCluster(job_body())
    step(cluster)
    assert cluster.workloads == {} and sorted(cluster.pods) == PODS


def test_the_admitted_gpu_flavor_picks_the_product_the_operator_would_not_have() -> None:
    """Two GPU products; Kueue admitted the job with the flavor of the smaller one (say its
    quota had room): the group goes there, not to the product with the most free GPUs."""
    cluster = queued(template={"spec": {"containers": [{
        "name": "tensorflow", "image": "w", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    ready = [{"type": "Ready", "status": "True"}]
    cluster.nodes = {name: {"metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": product}}, "spec": {}, "status": {
        "allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": ready}}
        for name, product, gpus in (("big", "A100", 8), ("small", "T4", 4))}
    cluster.objects["a100"] = {"metadata": {"name": "a100"}, "spec": {
        "nodeLabels": {"nvidia.com/gpu.product": "T4"}}}
    step(cluster)
    admit(cluster)
    step(cluster)
    assert {p["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
            for p in cluster.pods.values()} == {"T4"}
    assert cluster.status["gpuProduct"] == "T4"


def test_a_suspended_job_takes_its_workload_out_of_the_queue_and_back_when_resumed() -> None:
    cluster = running()
    cluster.set_spec(suspend=True)
    step(cluster)
    assert the_workload(cluster)["spec"]["active"] is False
    assert cluster.status["phase"] == "Suspended"
    evict(cluster, reason="Deactivated")  # what Kueue does to an inactive Workload
    step(cluster)
    assert "admission" in the_workload(cluster)["status"]  # its pods are still stopping
    cluster.finish_deletions()
    step(cluster)
    assert "admission" not in the_workload(cluster)["status"]  # the quota is back
    cluster.set_spec(suspend=False)
    step(cluster)
    assert the_workload(cluster)["spec"]["active"] is True
    assert cluster.pods == {} and cluster.status["phase"] == "Queued"
    admit(cluster)
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "1")


def test_a_gang_job_is_admitted_first_then_placed_whole() -> None:
    """Kueue and gang scheduling together: no PodGroup and no pod while queued; admitted, the
    generation's PodGroup comes first and every worker carries the gang's scheduler and the
    flavor's node labels."""
    cluster = queued(gang={"enabled": True})
    step(cluster)
    assert cluster.pods == {} and not [n for n in cluster.objects if n.startswith("demo-g")]
    admit(cluster)
    step(cluster)
    assert "demo-g0" in cluster.objects and cluster.objects["demo-g0"]["spec"]["minMember"] == 3
    for pod in cluster.pods.values():
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["spec"]["nodeSelector"]["gpu.product"] == "a100"


# --- spec.elastic: Kueue's partial admission (podSet minCount) ---


def test_an_elastic_job_lets_kueue_admit_as_few_as_its_min_workers() -> None:
    pod_set = desired_workload(job="demo", namespace="ns", uid="u1", owner={"uid": "u1"},
                               labels={}, queue="team", workers=3, min_workers=2,
                               template={"spec": {"containers": [{"name": "c"}]}},
                               priority=None, priority_value=None)["spec"]["podSets"][0]
    assert (pod_set["count"], pod_set["minCount"]) == (3, 2)
    at_min = desired_workload(job="demo", namespace="ns", uid="u1", owner={"uid": "u1"},
                              labels={}, queue="team", workers=2, min_workers=2,
                              template={"spec": {"containers": [{"name": "c"}]}},
                              priority=None, priority_value=None)["spec"]["podSets"][0]
    assert "minCount" not in at_min and "minCount" not in workload_for(3)["spec"]["podSets"][0]


def test_a_shrunk_group_keeps_its_admission_and_its_workload() -> None:
    """Reproduced: the shrink changed the Workload's podSet, so the admitted one was retired
    and a smaller one queued: the group stopped and waited behind the queue while its Event
    said "training on with 2"."""
    cluster = queued(elastic={"minWorkers": 2, "shrinkAfterSeconds": 30})
    step(cluster)
    admit(cluster)
    step(cluster)
    name = the_workload(cluster)["metadata"]["name"]
    cluster.run(0, 1)
    cluster.unschedulable(2, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    cluster.pods["demo-worker-2"]["status"]["conditions"][0]["lastTransitionTime"] = \
        cluster.now.isoformat()
    for _ in range(4):
        step(cluster, 10)
    assert (cluster.status["groupWorkers"], cluster.status["resizes"]) == (2, 1)
    step(cluster)  # the old pods go with their grace period
    cluster.finish_deletions()
    step(cluster)
    step(cluster)
    assert the_workload(cluster)["metadata"]["name"] == name  # the admitted one, kept
    assert sorted(cluster.pods) == PODS[:2]
    assert cluster.status["phase"] != "Queued"
    assert all(c["status"] != "True" for c in cluster.status["conditions"]
               if c["type"] == "Queued")


def admit_count(cluster: FakeCluster, count: int) -> None:
    admit(cluster)
    the_workload(cluster)["status"]["admission"]["podSetAssignments"][0]["count"] = count


def test_admitted_in_part_the_group_starts_at_the_admitted_size_and_keeps_its_workload(
) -> None:
    cluster = queued(elastic={"minWorkers": 2})
    step(cluster)
    name = the_workload(cluster)["metadata"]["name"]
    assert the_workload(cluster)["spec"]["podSets"][0]["minCount"] == 2
    admit_count(cluster, 2)
    step(cluster)
    step(cluster)
    assert sorted(cluster.pods) == PODS[:2]
    status = cluster.status
    assert (status["admittedWorkers"], status["totalWorkers"], status["size"]) == (2, 2, "2/3")
    assert "2 of 3 workers (the quota's partial admission" in queued_condition(cluster)[2]
    cluster.run()
    for _ in range(3):
        step(cluster, 200)  # no grow past what Kueue admitted, however long
    assert list(cluster.workloads) == [name] and cluster.status["groupGeneration"] == 0
    assert cluster.status["phase"] == "Running"


def test_admitted_whole_an_elastic_job_runs_at_full_size() -> None:
    cluster = queued(elastic={"minWorkers": 2})
    step(cluster)
    admit_count(cluster, 3)
    step(cluster)
    assert sorted(cluster.pods) == PODS and "admittedWorkers" not in cluster.status


def test_evicted_after_a_partial_admission_it_is_queued_again_for_the_full_size() -> None:
    cluster = queued(elastic={"minWorkers": 2})
    step(cluster)
    admit_count(cluster, 2)
    step(cluster)
    step(cluster)
    cluster.run()
    step(cluster)
    evict(cluster)
    step(cluster)
    assert "admittedWorkers" not in cluster.status
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    step(cluster)
    w = the_workload(cluster)
    assert w["spec"]["podSets"][0]["count"] == 3 and "admission" not in w["status"]
    admit_count(cluster, 3)
    step(cluster)
    assert sorted(cluster.pods) == PODS


@pytest.mark.parametrize(("finalizers", "deleting", "job", "expected"), [
    ([FINALIZER], True, None, True),  # its job gone, the garbage collector deleting it
    ([FINALIZER], False, None, False),  # its job maybe not seen yet (two watches)
    ([FINALIZER], True, {"metadata": {"uid": "u"}}, False),  # its job's pass handles it
    ([], True, None, False),  # not ours to let go of
])
def test_a_workload_is_orphaned_when_deleted_with_our_finalizer_and_no_job(
    finalizers: list[str], deleting: bool, job: Manifest | None, expected: bool,
) -> None:
    meta: Manifest = {"name": "w", "finalizers": finalizers}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    assert orphaned({"metadata": meta}, job) is expected
