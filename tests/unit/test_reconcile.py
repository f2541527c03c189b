"""Reconcile passes against an in-memory cluster: the whole lifecycle, one pass at a time."""

from __future__ import annotations

import copy
import logging
from datetime import timedelta
from typing import Any

import pytest
from multiworker.api import names
from multiworker.reconcile.context import Options
from multiworker.reconcile.reconcile import Outcome, reconcile
from multiworker.reconcile.render import shipped_scripts

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.fake_cluster import FakeCluster

PODS = ["demo-worker-0", "demo-worker-1", "demo-worker-2"]


def make(**spec: Any) -> FakeCluster:
    return FakeCluster(job_body(**spec))


def step(cluster: FakeCluster, seconds: float = 1) -> Outcome:
    cluster.now += timedelta(seconds=seconds)
    return reconcile(cluster, NAMESPACE, "demo", cluster.now)


def conditions(cluster: FakeCluster) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in cluster.status["conditions"]}


def started(**spec: Any) -> FakeCluster:
    """A job whose first group is running."""
    cluster = make(**spec)
    step(cluster)
    cluster.run()
    step(cluster)
    assert cluster.status["phase"] == "Running"
    return cluster


def test_create_makes_service_and_workers_once() -> None:
    cluster = make()
    step(cluster)
    assert sorted(cluster.pods) == PODS and list(cluster.services) == ["demo"]
    assert cluster.status["phase"] == "Pending"
    assert cluster.status["ready"] == "0/3"
    assert cluster.events == [("Normal", "GroupCreated", "created 3 workers of generation 0")]
    step(cluster)
    step(cluster)
    assert cluster.created_pods == PODS  # no duplicates
    cluster.run()
    step(cluster)
    assert cluster.status["phase"] == "Running" and cluster.status["ready"] == "3/3"
    assert conditions(cluster)["Running"] == ("True", "AllWorkersRunning")
    assert cluster.status["startTime"] and cluster.status["observedGeneration"] == 1


def test_worker_failure_restarts_the_whole_group_after_backoff() -> None:
    cluster = started(restartPolicy={"backoffSeconds": 10})
    cluster.exit(1, 137, "OOMKilled")
    outcome = step(cluster)
    status = cluster.status
    assert (status["phase"], status["groupGeneration"], status["restarts"]) == ("Restarting", 1, 1)
    assert status["lastFailure"]["worker"] == 1 and status["lastFailure"]["exitCode"] == 137
    assert cluster.events[-1] == (
        "Warning", "WorkerFailed",
        "restarting group: worker-1 exited 137 (OOMKilled); restart 1 of 3 in 10s",
    )
    assert outcome.requeue == 0
    step(cluster)  # deletes generation 0 (all of it, not only worker-1)
    assert all("deletionTimestamp" in p["metadata"] for p in cluster.pods.values())
    # Its collective is broken: no coordinated checkpoint to wait 30 s for, a few seconds
    # for sidecars to flush.
    assert [p["metadata"]["deletionGracePeriodSeconds"] for p in cluster.pods.values()] == \
        [3, 3, 3]
    cluster.finish_deletions()
    step(cluster)
    assert cluster.pods == {}  # still in backoff
    assert conditions(cluster)["Running"][0] == "False"
    step(cluster, seconds=10)
    assert cluster.generations() == dict.fromkeys(PODS, "1")
    cluster.run()
    step(cluster)
    status = cluster.status
    assert status["phase"] == "Running" and "recoveringSince" not in status
    assert status["lastRecoverySeconds"] > 0
    assert conditions(cluster)["Restarting"] == ("False", "AllWorkersRunning")


def test_a_group_deleted_is_one_log_line_not_one_per_pod(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = started(workers=8)
    cluster.exit(1, 137)
    step(cluster)
    with caplog.at_level(logging.INFO, logger="multiworker"):
        step(cluster)  # deletes generation 0
    deleting = [r.getMessage() for r in caplog.records if "deleting" in r.getMessage()]
    assert deleting == [("deleting 8 pods (demo-worker-0, demo-worker-1, demo-worker-2 and 5 "
                         "more) of generation 0 within 3s: its group is broken")]
    assert sum("deletionTimestamp" in p["metadata"] for p in cluster.pods.values()) == 8


def test_a_generation_is_deleted_by_its_labels_sparing_what_is_not_to_be_touched() -> None:
    """One deletion by label selector for the old generation's pods, not one per pod; a pod
    already terminating keeps its grace period, a copy carrying the labels is left alone."""
    cluster = started(workers=4)
    twin = copy.deepcopy(cluster.pods["demo-worker-3"])
    twin["metadata"].update(name="debug-copy", uid="uid-copy", ownerReferences=[])
    cluster.pods["debug-copy"] = twin
    cluster.user_deletes(3)  # terminating within its own 30 s
    step(cluster)
    step(cluster)  # deletes generation 0
    [deletion] = cluster.generation_deletions
    assert (deletion.job, deletion.generation, deletion.indexes) == ("demo", 0, (0, 1, 2))
    assert deletion.spared == ("debug-copy", "demo-worker-3")
    assert [d.name for d in deletion.pods] == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]
    grace = {n: p["metadata"].get("deletionGracePeriodSeconds") for n, p in cluster.pods.items()}
    assert grace == {"demo-worker-0": 30, "demo-worker-1": 30, "demo-worker-2": 30,
                     "demo-worker-3": 30, "debug-copy": None}


def test_deleted_pod_restarts_without_spending_the_budget() -> None:
    cluster = started()
    cluster.user_deletes(2)
    step(cluster)
    status = cluster.status
    assert (status["restarts"], status["disruptions"], status["groupGeneration"]) == (0, 1, 1)
    assert "restartAfter" not in status
    assert cluster.events[-1][1] == "WorkerDisrupted"
    step(cluster)
    # The others are alive and may checkpoint together on SIGTERM: their own grace period.
    assert [p["metadata"]["deletionGracePeriodSeconds"] for p in cluster.pods.values()] == \
        [30, 30, 30]
    cluster.finish_deletions()
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "1")  # no backoff


def test_vanished_pod_is_a_disruption() -> None:
    cluster = started()
    del cluster.pods["demo-worker-0"]
    step(cluster)
    assert cluster.status["disruptions"] == 1
    assert "worker-0 disappeared" in cluster.events[-1][2]


def test_budget_exhausted_fails_and_keeps_the_failed_pod_for_its_logs() -> None:
    cluster = started(restartPolicy={"maxRestarts": 0})
    cluster.exit(2, 1, message="Traceback\nRuntimeError: boom")
    step(cluster)
    status = cluster.status
    assert status["phase"] == "Failed" and status["completionTime"]
    assert conditions(cluster)["Failed"] == ("True", "RestartLimitExceeded")
    assert conditions(cluster)["Running"][0] == "False"
    assert "worker-2 exited 1 (Error: RuntimeError: boom)" in cluster.events[-1][2]
    step(cluster)
    terminating = {n for n, p in cluster.pods.items() if "deletionTimestamp" in p["metadata"]}
    assert terminating == {"demo-worker-0", "demo-worker-1"}


def test_fail_fast_exit_code() -> None:
    cluster = started(restartPolicy={"onExitCodes": [{"action": "FailJob", "values": [2]}]})
    cluster.exit(0, 2)
    step(cluster)
    assert conditions(cluster)["Failed"] == ("True", "ExitCodeFailsJob")
    assert cluster.status["restarts"] == 0


def test_chief_success_succeeds_and_stops_the_others() -> None:
    cluster = started()
    cluster.exit(0, 0)
    cluster.exit(1, 4)  # a peer noticing the chief left must not restart a finished job
    step(cluster)
    assert cluster.status["phase"] == "Succeeded"
    assert conditions(cluster)["Succeeded"] == ("True", "ChiefSucceeded")
    step(cluster)
    assert "deletionTimestamp" in cluster.pods["demo-worker-2"]["metadata"]
    assert "deletionTimestamp" not in cluster.pods["demo-worker-0"]["metadata"]


def test_a_chief_whose_exit_the_kubelet_reported_before_the_phase_is_kept() -> None:
    """Its container terminated, its phase still Running for a moment: the pod has ended all
    the same (it was deleted, logs and all, when cleanup went by the phase alone)."""
    cluster = started()
    cluster.exit(0, 0)
    cluster.pods["demo-worker-0"]["status"]["phase"] = "Running"
    step(cluster)
    assert cluster.status["phase"] == "Succeeded"
    step(cluster)
    assert "deletionTimestamp" not in cluster.pods["demo-worker-0"]["metadata"]
    assert "deletionTimestamp" in cluster.pods["demo-worker-1"]["metadata"]


def test_pods_a_sidecar_keeps_running_are_deleted_when_the_job_succeeds() -> None:
    """cleanPodPolicy Running goes by the pod's phase: a pod whose trainer exited 0 while a
    classic sidecar runs on still holds its GPUs, and must go; an ended pod stays for its logs."""
    cluster = started()
    cluster.exit(0, 0, sidecar=True)
    cluster.exit(1, 0)
    cluster.exit(2, 0, sidecar=True)
    step(cluster)
    assert cluster.status["phase"] == "Succeeded"
    step(cluster)
    deleted = {n for n, p in cluster.pods.items() if "deletionTimestamp" in p["metadata"]}
    assert deleted == {"demo-worker-0", "demo-worker-2"}


def test_a_template_edited_while_running_judges_no_running_pod_by_the_new_template() -> None:
    """A job without a `tensorflow` container trains in its first one; inserting a sidecar
    first made every running pod look Starting since its creation -> Failed: StartupTimeout.
    Each pod is judged by what it was created with; the edit applies to the next group."""
    main = {"name": "main", "image": "w"}
    cluster = make(template={"spec": {"containers": [main]}},
                   health={"startupTimeoutSeconds": 60})
    step(cluster)
    for pod in cluster.pods.values():  # the kubelet reports the pod's own container
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = {"phase": "Running", "podIP": "10.88.0.10",
                         "conditions": [{"type": "Ready", "status": "True"}],
                         "containerStatuses": [{"name": "main", "state": {"running": {}}}]}
    step(cluster)
    assert cluster.status["phase"] == "Running"
    sidecar = {"name": "log-shipper", "image": "s"}
    cluster.set_spec(template={"spec": {"containers": [sidecar, main]}})
    for _ in range(3):
        step(cluster, seconds=60)
    assert cluster.status["phase"] == "Running", conditions(cluster)
    assert cluster.status.get("restarts", 0) == 0 and cluster.created_pods == PODS
    # The pods record their trainer; the next group's pods record the new first container.
    assert {p["metadata"]["annotations"]["multiworker.dev/trainer-container"]
            for p in cluster.pods.values()} == {"main"}


def test_a_succeeded_job_shows_the_chiefs_final_figures_not_the_last_poll() -> None:
    """The last poll came before the end (step 220 of 300 shown for a finished run): the
    chief's final report, left as its termination message, is what status.progress says."""
    cluster = started()
    final = ('final progress: {"workerIndex":0,"generation":0,"phase":"done","step":300,'
             '"epoch":20,"loss":0.05,"lastCheckpointStep":300,"restoredFromStep":0}')
    cluster.exit(0, 0, message=final)
    step(cluster)
    assert cluster.status["phase"] == "Succeeded"
    progress = cluster.status["progress"]
    assert (progress["step"], progress["epoch"], progress["lastCheckpointStep"]) == (300, 20, 300)


def test_a_plain_script_that_leaves_no_final_report_keeps_what_was_polled() -> None:
    cluster = started()
    cluster.exit(0, 0, message="bye")
    step(cluster)
    assert cluster.status["phase"] == "Succeeded" and "progress" not in cluster.status


def test_clean_pod_policy_all_and_ttl() -> None:
    cluster = started(cleanPodPolicy="All", ttlSecondsAfterFinished=60)
    for i in range(3):
        cluster.exit(i, 0)
    step(cluster)
    outcome = step(cluster)
    assert all("deletionTimestamp" in p["metadata"] for p in cluster.pods.values())
    assert outcome.requeue == pytest.approx(59)
    step(cluster, seconds=59)
    assert cluster.job is None


def test_suspend_deletes_the_group_and_resume_starts_the_next() -> None:
    cluster = started()
    cluster.set_spec(suspend=True)
    step(cluster)
    assert cluster.status["phase"] == "Suspended" and cluster.status["groupGeneration"] == 1
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    assert cluster.pods == {}
    cluster.set_spec(suspend=False)
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "1")
    assert conditions(cluster)["Suspended"] == ("False", "JobResumed")
    assert cluster.status["restarts"] == 0


def test_created_suspended_keeps_generation_zero() -> None:
    cluster = make(suspend=True)
    step(cluster)
    assert cluster.pods == {} and cluster.status["phase"] == "Suspended"
    cluster.set_spec(suspend=False)
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "0")


def test_crash_before_the_status_write_converges_without_duplicates() -> None:
    cluster = make()
    cluster.fail_status_writes = 1
    with pytest.raises(RuntimeError):
        step(cluster)
    assert sorted(cluster.pods) == PODS and "groupStartTime" not in cluster.status
    del cluster.pods["demo-worker-2"]  # it was never created, say
    step(cluster)
    assert cluster.created_pods == [*PODS, "demo-worker-2"]
    assert cluster.status["groupStartTime"]


def test_a_pass_on_an_outdated_view_changes_nothing() -> None:
    """Another actor restarted the group after this pass read the job: its new pods must not
    be taken for stale ones, and nothing this pass decided may be written."""
    cluster = started()
    outdated = copy.deepcopy(cluster.job)
    cluster.exit(1, 1)
    step(cluster)
    step(cluster)
    cluster.finish_deletions()
    step(cluster, seconds=1)
    assert cluster.generations() == dict.fromkeys(PODS, "1")
    status, events = cluster.status, list(cluster.events)
    cluster.serve_once = outdated
    assert step(cluster).requeue == 1  # look again once the cache caught up
    assert all("deletionTimestamp" not in p["metadata"] for p in cluster.pods.values())
    assert (cluster.status, cluster.events) == (status, events)


def test_an_event_the_api_server_refuses_does_not_fail_the_pass() -> None:
    """Status is the record, Events are commentary: a failed Event POST after the status
    write must not fail the pass (it would run again and create the group twice)."""
    cluster = make()
    cluster.fail_events = 1
    step(cluster)  # raised the injected failure before
    assert sorted(cluster.pods) == PODS and cluster.status["phase"] == "Pending"
    assert cluster.events == []  # the GroupCreated Event is lost, the status is not
    step(cluster)
    assert cluster.created_pods == PODS


def test_status_write_is_refused_when_the_job_changed_meanwhile() -> None:
    cluster = make()
    step(cluster)
    outdated = copy.deepcopy(cluster.job)
    cluster.run()
    cluster.set_spec(ttlSecondsAfterFinished=600)  # someone edits the job mid-pass
    cluster.serve_once = outdated
    assert step(cluster).requeue == 1.0  # its watch event wakes it; this is the fallback
    assert cluster.status["phase"] == "Pending"
    step(cluster)
    assert cluster.status["phase"] == "Running"


def test_invalid_spec_fails_once_naming_the_field() -> None:
    cluster = FakeCluster(job_body(name="x" * 60))
    reconcile(cluster, NAMESPACE, "x" * 60, cluster.now)
    reconcile(cluster, NAMESPACE, "x" * 60, cluster.now)
    assert cluster.status["phase"] == "Failed" and cluster.pods == {}
    [(kind, reason, message)] = cluster.events
    assert (kind, reason) == ("Warning", "InvalidSpec")
    assert message.startswith("invalid spec: metadata.name: worker hostname")


def test_rejected_pod_fails_with_the_servers_words() -> None:
    cluster = make()
    cluster.reject_pods = 'Pod "demo-worker-0" is invalid: spec.containers[0].image: Required'
    step(cluster)
    assert conditions(cluster)["Failed"] == ("True", "InvalidPodTemplate")
    assert "spec.containers[0].image: Required" in cluster.events[-1][2]


def test_foreign_service_blocks_with_a_warning() -> None:
    cluster = make()
    cluster.services["demo"] = {"metadata": {"name": "demo", "ownerReferences": []}}
    outcome = step(cluster)
    assert cluster.pods == {}
    assert conditions(cluster)["Running"] == ("False", "ObjectConflict")
    assert cluster.events[-1][0] == "Warning" and outcome.requeue == 30
    step(cluster)
    assert len(cluster.events) == 1  # not repeated every pass


def test_startup_timeout_fails_the_job() -> None:
    cluster = make(health={"startupTimeoutSeconds": 60})
    step(cluster)
    cluster.run(0, 1)
    outcome = step(cluster)
    assert outcome.requeue == pytest.approx(59)
    step(cluster, seconds=60)
    assert conditions(cluster)["Failed"] == ("True", "StartupTimeout")
    assert "worker-2 could not start within 60s" in cluster.events[-1][2]


def test_unschedulable_worker_is_reported_once() -> None:
    cluster = make()
    step(cluster)
    cluster.run(0, 1)
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    cluster.unschedulable(2, message)
    step(cluster)
    step(cluster)
    status = cluster.status
    assert status["phase"] == "Pending" and status["ready"] == "2/3"
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["reason"] == "Unschedulable"
    assert running["message"].startswith(
        f"1 of 3 workers cannot be scheduled (worker-2: {message}); 2 placed workers of this "
        "job wait for them")
    assert [e for e in cluster.events if e[0] == "Warning"] == [
        ("Warning", "Unschedulable", running["message"])]


def test_a_change_of_counts_alone_waits_a_second_after_the_last_write() -> None:
    """ready 3/3 -> 2/3 and nothing else: not written within a second of the last write (a
    starting group of 256 wrote ~30 such statuses), written when the pass comes again."""
    cluster = started()
    conditions = cluster.pods["demo-worker-2"]["status"]["conditions"]
    conditions[:] = [c for c in conditions if c["type"] != "Ready"] + [
        {"type": "Ready", "status": "False"}]
    cluster.now += timedelta(seconds=1)
    written = cluster.now - timedelta(seconds=0.4)
    outcome = reconcile(cluster, NAMESPACE, "demo", cluster.now, last_write=written)
    assert cluster.status["ready"] == "3/3" and outcome.written is None
    assert outcome.requeue == pytest.approx(0.6)
    cluster.now += timedelta(seconds=0.6)
    outcome = reconcile(cluster, NAMESPACE, "demo", cluster.now, last_write=written)
    assert cluster.status["ready"] == "2/3" and outcome.written is not None


def test_a_groups_progress_waits_and_its_end_is_written_at_once() -> None:
    """Pending -> Starting ("worker-0 is starting", the Running condition's reason and the
    counts) waits for a second after the last write; the group running does not."""
    cluster = make()
    step(cluster)
    assert cluster.status["phase"] == "Pending"
    written, pending = cluster.now, cluster.status
    for pod in cluster.pods.values():
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = {"phase": "Pending", "hostIP": "10.0.0.1", "containerStatuses": [
            {"name": "tensorflow", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    outcome = reconcile(cluster, NAMESPACE, "demo", written + timedelta(seconds=0.2),
                        last_write=written)
    assert outcome.written is None and cluster.status == pending
    assert outcome.requeue == pytest.approx(0.8)
    outcome = reconcile(cluster, NAMESPACE, "demo", written + timedelta(seconds=1),
                        last_write=written)
    assert cluster.status["phase"] == "Starting" and outcome.written is not None
    cluster.run()
    outcome = reconcile(cluster, NAMESPACE, "demo", written + timedelta(seconds=1.1),
                        last_write=written + timedelta(seconds=1))
    assert (cluster.status["phase"], cluster.status["ready"]) == ("Running", "3/3")


def test_a_change_beyond_counts_is_written_at_once() -> None:
    cluster = started()
    cluster.exit(1, 137)
    cluster.now += timedelta(seconds=1)
    reconcile(cluster, NAMESPACE, "demo", cluster.now, last_write=cluster.now)
    assert cluster.status["phase"] == "Restarting"


def test_unschedulable_counts_that_move_are_not_new_events() -> None:
    """One Event per gist: "1 of 3" becoming "2 of 3" cannot be scheduled is the same news;
    another refusal is not."""
    cluster = make()
    step(cluster)
    cluster.run(0)
    cluster.unschedulable(2, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    step(cluster)
    cluster.unschedulable(1, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    step(cluster)
    running = next(c for c in cluster.status["conditions"] if c["type"] == "Running")
    assert running["message"].startswith("2 of 3 workers cannot be scheduled")
    warnings = [e for e in cluster.events if e[0] == "Warning"]
    assert [e[2][:36] for e in warnings] == ["1 of 3 workers cannot be scheduled ("]
    cluster.unschedulable(1, "0/2 nodes are available: 2 node(s) had untolerated taint(s).")
    cluster.unschedulable(2, "0/2 nodes are available: 2 node(s) had untolerated taint(s).")
    step(cluster)
    warnings = [e for e in cluster.events if e[0] == "Warning"]
    assert len(warnings) == 2 and "untolerated taint" in warnings[1][2]


def test_workers_not_yet_placed_read_no_other_jobs_pods() -> None:
    """Every pass of a starting group sees pods not yet bound; only a scheduler's refusal
    needs every pod the operator watches (who holds what), which at 1,000 jobs is 8,000."""
    cluster = make()
    step(cluster)
    cluster.run(0, 1)
    reads = 0
    all_pods = cluster.cached_all_pods

    def counted() -> list[dict[str, object]]:
        nonlocal reads
        reads += 1
        return all_pods()

    cluster.cached_all_pods = counted  # type: ignore[method-assign]
    step(cluster)  # worker-2 pending, not refused
    assert reads == 0
    cluster.unschedulable(2, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    step(cluster)
    assert reads == 1


def test_gone_job_stops_the_loop() -> None:
    cluster = make()
    cluster.job = None
    assert step(cluster).gone


def gpu_node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


GPU_TEMPLATE = {"spec": {"containers": [{"name": "tensorflow", "image": "w",
                                         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def test_a_group_goes_to_one_gpu_product_and_says_which() -> None:
    cluster = make(template=GPU_TEMPLATE)
    cluster.nodes = {"a": gpu_node("a", "A100", 2), "b": gpu_node("b", "T4", 4)}
    step(cluster)
    assert cluster.status["gpuProduct"] == "T4"
    selectors = {p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for p in cluster.pods.values()}
    assert selectors == {"T4"}


@pytest.mark.parametrize(("node_b", "template_spec"), [
    # A pool the job does not tolerate (another team's, a test's fake nodes) ...
    ({"spec": {"taints": [{"key": "pool", "value": "x", "effect": "NoSchedule"}]}}, {}),
    # ... or one its node selector or required affinity rules out.
    ({}, {"nodeSelector": {"pool": "a"}}),
])
def test_a_gpu_product_on_nodes_the_workers_cannot_use_is_no_candidate(
        node_b: dict[str, Any], template_spec: dict[str, Any]) -> None:
    template = {"spec": {**GPU_TEMPLATE["spec"], **template_spec}}
    cluster = make(template=template)
    a, b = gpu_node("a", "A100", 4), gpu_node("b", "T4", 8)
    a["metadata"]["labels"]["pool"] = "a"
    cluster.nodes = {"a": a, "b": {**b, **node_b}}
    step(cluster)
    assert cluster.status["gpuProduct"] == "A100"  # T4 has more room, on nodes out of reach


def test_no_gpu_product_with_room_holds_the_group_back_then_fails() -> None:
    cluster = make(template=GPU_TEMPLATE, health={"startupTimeoutSeconds": 60})
    cluster.nodes = {"a": gpu_node("a", "A100", 2), "b": gpu_node("b", "T4", 2)}
    step(cluster)
    assert cluster.pods == {}
    assert conditions(cluster)["Running"] == ("False", "NoGpuProductWithRoom")
    running = next(c for c in cluster.status["conditions"] if c["type"] == "Running")
    assert running["message"].startswith("no single GPU product has room for 3 workers × 1 GPUs")
    step(cluster, seconds=30)
    assert len([e for e in cluster.events if e[1] == "NoGpuProductWithRoom"]) == 1
    step(cluster, seconds=30)
    assert conditions(cluster)["Failed"] == ("True", "StartupTimeout")


def gpu_template(amount: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "tensorflow", "image": "w",
                                     "resources": {"limits": {"nvidia.com/gpu": amount}}}]}}


@pytest.mark.parametrize("amount", ["1.0", "2k"])
def test_gpu_quantities_kubernetes_accepts_create_the_group(amount: str) -> None:
    cluster = make(template=gpu_template(amount))
    step(cluster)  # raised ValueError on every pass before ("1.0": int() refused it)
    assert sorted(cluster.pods) == PODS


def test_a_fractional_gpu_fails_the_job_once_naming_the_container() -> None:
    cluster = make(template=gpu_template("0.5"))
    step(cluster)
    step(cluster)
    assert cluster.pods == {} and cluster.status["phase"] == "Failed"
    assert conditions(cluster)["Failed"] == ("True", "InvalidPodTemplate")
    [(kind, reason, message)] = cluster.events
    assert (kind, reason) == ("Warning", "InvalidPodTemplate")
    assert "containers[tensorflow]: nvidia.com/gpu 0.5 is not a whole number of GPUs" in message


def test_a_pinned_image_is_what_the_next_group_runs() -> None:
    cluster = started()
    for i, image in enumerate(("r/w@sha256:aaa", "r/w@sha256:bbb", "r/w@sha256:aaa")):
        cluster.pods[PODS[i]]["status"]["containerStatuses"][0]["imageID"] = image
    step(cluster)
    assert cluster.status["pinnedImage"] == "r/w@sha256:aaa"
    assert (cluster.status["disruptions"], cluster.status["restarts"]) == (1, 0)
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    assert {p["spec"]["containers"][0]["image"] for p in cluster.pods.values()} == {
        "r/w@sha256:aaa"}


def test_with_worker_network_policy_the_job_gets_one_before_its_pods() -> None:
    cluster = make()
    options = Options(policy_operator_namespace="ops")
    cluster.now += timedelta(seconds=1)
    reconcile(cluster, NAMESPACE, "demo", cluster.now, options=options)
    policy = cluster.objects["demo-workers"]
    assert policy["kind"] == "NetworkPolicy" and sorted(cluster.pods) == PODS
    assert policy["metadata"]["ownerReferences"][0]["uid"] == cluster.job["metadata"]["uid"]  # type: ignore[index]
    peers, operator = policy["spec"]["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": {
        "multiworker.dev/job-name": "demo"}}}]}
    # The progress port, and the in-place restart agent's (whatever the mode: it may change).
    assert operator["ports"] == [{"protocol": "TCP", "port": 8471},
                                 {"protocol": "TCP", "port": 8472}]
    assert operator["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "ops"}}


def test_without_the_option_no_network_policy_is_made() -> None:
    cluster = make()
    step(cluster)
    assert "demo-workers" not in cluster.objects and sorted(cluster.pods) == PODS


def test_the_group_s_addresses_are_in_a_configmap_made_before_its_pods() -> None:
    cluster = make(workers=3, port=2345)
    step(cluster)
    [name] = [n for n, o in cluster.objects.items() if o["kind"] == "ConfigMap"]
    config = cluster.objects[name]
    assert name.startswith("demo-tf-") and sorted(cluster.pods) == PODS
    assert config["metadata"]["ownerReferences"][0]["uid"] == cluster.job["metadata"]["uid"]  # type: ignore[index]
    assert config["data"] == {"workers": '["demo-worker-0.demo.ml.svc:2345",'
                                         '"demo-worker-1.demo.ml.svc:2345",'
                                         '"demo-worker-2.demo.ml.svc:2345"]',
                              **shipped_scripts()}
    env = cluster.pods["demo-worker-0"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["configMapKeyRef"] == {"name": name, "key": "workers"}


def test_another_worker_count_gets_another_configmap() -> None:
    """spec.workers changed while suspended: the next group's pods refer to a ConfigMap that
    lists them, never to the old one (which the operator cannot read, so never rewrites)."""
    made: set[str] = set()
    for workers in (3, 4):
        cluster = make(workers=workers)
        step(cluster)
        made |= {n for n, o in cluster.objects.items() if o["kind"] == "ConfigMap"}
    assert len(made) == 2


def unreachable_node(since: str) -> dict[str, Any]:
    return {"metadata": {"name": "node-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": since}]}}


@pytest.mark.parametrize("back", [True, False])
def test_a_lost_node_is_read_from_the_api_before_the_group_restarts(back: bool) -> None:
    """The node watch may lag a node that came back: the group restarts only if the node, as
    the API has it now, is still in trouble; a node that is fine is not read on every pass."""
    cluster = started(health={"nodeLostSeconds": 20})
    step(cluster)
    assert cluster.node_reads == []
    cluster.nodes["node-2"] = {**cluster.nodes["node-1"], "metadata": {"name": "node-2"}}
    cluster.nodes["node-1"] = unreachable_node(cluster.status["startTime"])
    if back:
        cluster.live_nodes["node-1"] = {"metadata": {"name": "node-1"}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}]}}
    step(cluster, seconds=30)
    assert cluster.node_reads == ["node-1"]
    restarted = cluster.status.get("disruptions", 0) == 1
    assert restarted is not back, cluster.events
    if back:
        assert cluster.status["phase"] == "Running" and cluster.created_pods == PODS


def test_every_node_unreachable_at_once_is_the_control_plane_not_the_nodes() -> None:
    """An API server back from an outage finds every Lease stale: the node lifecycle
    controller marks every node unreachable until its kubelet posts again (seconds, or more
    while the kubelets' own retries back off). That is its FullDisruption — it evicts nothing —
    and no group restarts for it; one node unreachable among Ready ones is a lost node."""
    cluster = started(health={"nodeLostSeconds": 20})
    cluster.nodes["node-1"] = unreachable_node(cluster.status["startTime"])
    step(cluster, seconds=30)
    assert cluster.status.get("disruptions", 0) == 0, cluster.events
    cluster.nodes["node-2"] = {"metadata": {"name": "node-2"}, "status": {
        "conditions": [{"type": "Ready", "status": "True"}]}}
    step(cluster)
    assert cluster.status.get("disruptions", 0) == 1, cluster.events


def test_a_node_whose_lease_went_silent_restarts_the_group_before_it_turns_notready() -> None:
    """The node object still says Ready (NotReady comes 50 s after the last heartbeat); its
    Lease has not been renewed for nodeLostSeconds and its worker does not answer."""
    cluster = started(health={"nodeLostSeconds": 20})
    cluster.silences["node-1"] = 15.0  # trouble, not yet 20 s of it
    step(cluster)
    assert cluster.status.get("disruptions", 0) == 0
    cluster.silences["node-1"] = 21.0
    step(cluster, seconds=6)
    assert cluster.status.get("disruptions", 0) == 1, cluster.events
    assert "node node-1 last renewed its Lease at" in cluster.status["lastFailure"]["message"]


def test_a_peer_aborting_as_its_node_powers_off_is_a_disruption_not_a_restart() -> None:
    """worker-2 (node-2) exits 4 at once: its peers on node-1, which just powered off, reset
    their connections. The pass waits for node-1 to renew its Lease; it does not, and once
    silent it is the node's loss that broke the group."""
    cluster = started(health={"nodeLostSeconds": 20})
    cluster.pods[names.worker_name(cluster.job_name, 2)]["spec"]["nodeName"] = "node-2"
    cluster.exit(2, 4)
    cluster.silences.update({"node-1": 8.0, "node-2": 1.0})  # as of the next pass
    step(cluster, seconds=6)  # past the collateral window; node-1 not seen since the exit
    assert cluster.status.get("restarts", 0) == 0 and cluster.status.get("disruptions", 0) == 0
    cluster.silences.update({"node-1": 14.0, "node-2": 3.0})
    step(cluster, seconds=6)
    assert cluster.status.get("restarts", 0) == 0, cluster.events
    assert cluster.status.get("disruptions", 0) == 1, cluster.events
    assert "node node-1 last renewed its Lease at" in cluster.status["lastFailure"]["message"]


def test_pods_on_a_node_that_becomes_lost_after_the_restart_go_as_soon_as_it_does() -> None:
    """A symptom restarts the group when node-1 is silent but not yet nodeLostSeconds long:
    its fenced pods are force-deleted when it counts as lost (4 s later), not 3 + 30 s after
    their deletion began."""
    cluster = started(health={"nodeLostSeconds": 20}, checkpoint={"claimName": "ckpt"})
    assert cluster.job is not None
    cluster.job["status"]["progress"] = {"step": 40, "lastCheckpointStep": 40}
    cluster.nodes["node-2"] = {**cluster.nodes["node-1"], "metadata": {"name": "node-2"}}
    cluster.pods[names.worker_name(cluster.job_name, 2)]["spec"]["nodeName"] = "node-2"
    cluster.exit(2, 4)
    cluster.silences.update({"node-1": 14.0, "node-2": 1.0})
    step(cluster)  # node-1 silent since before the exit: a disruption
    assert cluster.status.get("disruptions", 0) == 1, cluster.events
    cluster.silences["node-1"] = 15.0
    step(cluster)  # deletes the old group
    cluster.silences["node-1"] = 16.0
    outcome = step(cluster)
    assert not [r for _, r, _ in cluster.events if r == "StalePodForceDeleted"]
    assert outcome.requeue is not None and outcome.requeue <= 4, outcome
    cluster.silences["node-1"] = 20.0
    step(cluster, seconds=4)
    forced = [m for _, r, m in cluster.events if r == "StalePodForceDeleted"]
    assert len(forced) == 2 and "its node is lost" in forced[0], forced


@pytest.mark.parametrize("reported", [True, False])
def test_pods_on_a_lost_node_are_force_deleted_at_once_only_where_the_fence_guards(
    reported: bool,
) -> None:
    """A node lost with its kubelet: no one will stop its pods, so the new group waits for
    their force-delete. Where the workers run the runtime (they reported progress) with
    checkpoints, the fence stops a trainer that still runs there from saving, and the pods go
    at once; a script of its own is given its grace period and 30 s more, as before."""
    cluster = started(health={"nodeLostSeconds": 20},
                      checkpoint={"claimName": "ckpt"})
    if reported:
        assert cluster.job is not None
        cluster.job["status"]["progress"] = {"step": 40, "lastCheckpointStep": 40}
    cluster.silences["node-1"] = 25.0
    step(cluster)  # the group restarts
    assert cluster.status.get("disruptions", 0) == 1, cluster.events
    step(cluster)  # its pods are deleted (grace 30 s)
    step(cluster)
    forced = [m for _, r, m in cluster.events if r == "StalePodForceDeleted"]
    if reported:
        assert len(forced) == 3 and not cluster.pods.keys() - set(cluster.created_pods[3:])
        assert "its node is lost and the job's checkpoints are fenced" in forced[0]
        # The node still looks Ready to the scheduler: the new group must not go there.
        step(cluster)
        assert cluster.status["groupGeneration"] == 1 and len(cluster.pods) == 3
        for pod in cluster.pods.values():
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert terms == [{"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}]
    else:
        assert forced == [] and all("deletionTimestamp" in cluster.pods[n]["metadata"]
                                    for n in PODS)
        step(cluster, seconds=61)  # grace and 30 s more
        assert len([r for _, r, _ in cluster.events if r == "StalePodForceDeleted"]) == 3


def test_a_lease_the_watch_has_not_shown_renewed_is_read_before_a_silent_node_is_lost() -> None:
    """node-1 looks silent for 25 s (the watch lags or stalled) but its Lease in the API was
    renewed: read once more before acting, it is up, and the group keeps training."""
    cluster = started(health={"nodeLostSeconds": 20})
    cluster.silences["node-1"] = 25.0
    cluster.renewed_in_api.add("node-1")
    step(cluster)
    assert cluster.lease_reads == ["node-1"]
    assert (cluster.status["groupGeneration"], cluster.status.get("disruptions", 0)) == (0, 0)


def test_a_group_placed_away_from_a_silent_node_is_placed_again_once_the_node_is_back() -> None:
    """The group restarted for node-1's silent Lease is created away from node-1; a group
    that fits only there is refused by the scheduler. Its pods' affinity cannot change: once
    node-1 renews its Lease the group is made again, spending neither a restart nor a
    disruption, instead of waiting out startupTimeoutSeconds and failing."""
    cluster = started(health={"nodeLostSeconds": 20})
    cluster.silences["node-1"] = 21.0
    step(cluster, seconds=6)
    assert (cluster.status["groupGeneration"], cluster.status["disruptions"]) == (1, 1)
    step(cluster)  # deletes generation 0
    cluster.finish_deletions()
    step(cluster)  # creates generation 1 away from node-1
    assert {p["metadata"]["annotations"].get(names.ANNOTATION_AVOIDED_NODES)
            for p in cluster.pods.values()} == {"node-1"}
    for i in range(3):
        cluster.unschedulable(i, "0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                 "affinity/selector.")
    outcome = step(cluster)
    assert cluster.status["groupGeneration"] == 1  # node-1 still silent: looks again soon
    assert outcome.requeue is not None and outcome.requeue <= 5, outcome
    cluster.silences["node-1"] = 2.0
    step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status["disruptions"], status.get("restarts", 0)) == \
        (2, 1, 0)
    assert status["lastFailure"]["reason"] == "NodeLost"  # what actually went wrong
    assert cluster.events[-1][:2] == ("Normal", "AvoidedNodeBack"), cluster.events
    assert "worker-0 cannot be scheduled away from node-1" in cluster.events[-1][2]
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    assert cluster.generations() == dict.fromkeys(PODS, "2")
    assert all(names.ANNOTATION_AVOIDED_NODES not in p["metadata"].get("annotations", {})
               for p in cluster.pods.values())


def test_a_flapping_node_cannot_keep_a_group_that_fits_only_with_it_waiting_for_ever() -> None:
    """node-1 comes back and goes silent again before each new group is made: each group
    avoids it and is refused. Placing the group again must not restart its start-up clock:
    the job fails at startupTimeoutSeconds from the first placement, naming the refusal."""
    cluster = started(health={"nodeLostSeconds": 20, "startupTimeoutSeconds": 120})
    cluster.silences["node-1"] = 21.0
    step(cluster, seconds=6)  # generation 1 for the silent node
    first_placement = None
    for _ in range(8):
        step(cluster)  # deletes the old generation
        cluster.finish_deletions()
        step(cluster)  # the new group, away from node-1 (silent again)
        if cluster.status.get("phase") == "Failed":
            break
        first_placement = first_placement or cluster.now
        for i in range(3):
            cluster.unschedulable(i, "0/1 nodes are available: 1 node(s) didn't match "
                                     "Pod's node affinity/selector.")
        step(cluster, seconds=30)  # refused while node-1 is silent
        cluster.silences["node-1"] = 2.0
        step(cluster)  # node-1 back: placed again
        if cluster.status.get("phase") == "Failed":
            break
        cluster.silences["node-1"] = 21.0
    assert cluster.status.get("phase") == "Failed", cluster.events
    failed = conditions(cluster)["Failed"]
    assert failed == ("True", "StartupTimeout"), cluster.events
    assert first_placement is not None and cluster.now - first_placement <= timedelta(seconds=160)
    assert "could not start within 120s (Unschedulable" in cluster.events[-1][2], cluster.events


def test_a_group_refused_on_a_full_gpu_product_is_placed_again_on_one_with_room() -> None:
    """The group went to T4 (the most capacity); another job took T4's GPUs before the
    scheduler bound it. A100 has room for all three workers: the group moves there instead
    of waiting for T4 until startupTimeoutSeconds, spending nothing."""
    cluster = make(template=GPU_TEMPLATE)
    cluster.nodes = {"a": gpu_node("a", "A100", 3), "b": gpu_node("b", "T4", 4)}
    step(cluster)
    assert cluster.status["gpuProduct"] == "T4"
    cluster.pods["other-job-0"] = {
        "metadata": {"name": "other-job-0", "namespace": "elsewhere", "uid": "u-other",
                     "labels": {}},
        "spec": {"nodeName": "b", "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
        "status": {"phase": "Running"}}
    for i in range(3):
        cluster.unschedulable(i, "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 "
                                 "node(s) didn't match Pod's node affinity/selector.")
    step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status.get("restarts", 0),
            status.get("disruptions", 0)) == (1, 0, 0), cluster.events
    assert cluster.events[-1][:2] == ("Normal", "GpuProductFull"), cluster.events
    assert "A100 has room for all 3 workers" in cluster.events[-1][2]
    step(cluster)
    cluster.finish_deletions()
    step(cluster)
    assert cluster.status["gpuProduct"] == "A100", cluster.events
    assert {p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for n, p in cluster.pods.items()
            if n in PODS} == {"A100"}


def test_a_node_back_that_could_never_hold_the_group_does_not_place_it_again() -> None:
    """A GPU group avoided a node whose Lease went silent; that node is a CPU node. When it
    renews its Lease, placing the group again would help nothing and restart its start-up
    clock: the group stays, and the pass looks again later."""
    cluster = make(template=GPU_TEMPLATE)
    cluster.nodes = {"gpu": gpu_node("gpu", "T4", 4),
                     "cpu": {"metadata": {"name": "cpu"}, "spec": {},
                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}
    cluster.silences["cpu"] = 21.0
    step(cluster)  # the first group, away from the silent CPU node
    assert {p["metadata"]["annotations"].get(names.ANNOTATION_AVOIDED_NODES)
            for p in cluster.pods.values()} == {"cpu"}
    for i in range(3):
        cluster.unschedulable(i, "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 "
                                 "node(s) didn't match Pod's node affinity/selector.")
    cluster.silences["cpu"] = 2.0
    outcome = step(cluster)
    assert cluster.status["groupGeneration"] == 0, cluster.events
    assert not [r for _, r, _ in cluster.events if r == "AvoidedNodeBack"]
    assert outcome.requeue is not None and outcome.requeue <= 5, outcome
