"""What clusters do to an operator, on a real API server: quota and admission refusals, a
training script that serves no progress, nodes that stop answering, a job recreated under
the same name. Each must end in a clear status — never a loop, never a wrong restart."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster import Cluster
from tests.integration.fake_nodes import FakeNode
from tests.integration.jobs import Jobs, Obj, condition, generation_of, job
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("images", "operator")

SLEEP = "exec sleep 3600"


def test_quota_refusal_deletes_the_partial_group_and_retries_until_it_fits(jobs: Jobs) -> None:
    jobs.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
                "spec": {"hard": {"pods": "2"}}})
    jobs.apply(job("train", SLEEP, workers=3))
    status = jobs.wait("train", "a QuotaExceeded condition",
                       lambda s: s if (c := condition(s, "Running")) is not None
                       and c["reason"] == "QuotaExceeded" else None)
    message = condition(status, "Running")["message"]  # type: ignore[index]
    assert "worker pods refused by quota" in message and "exceeded quota" in message
    jobs.wait_event("train", "Warning", "QuotaExceeded")
    # No partial group sits waiting for peers that will never come.
    wait_for(lambda: len([p for p in jobs.pods("train")
                          if "deletionTimestamp" not in p["metadata"]]) < 3, 30,
             describe="the partial group to be deleted")
    jobs.kubectl("patch", "resourcequota", "pods", "--type=merge",
                 "-p", json.dumps({"spec": {"hard": {"pods": "10"}}}))
    status = jobs.wait("train", "the whole group running", lambda s: s if s.get("phase") ==
                       "Running" else None, timeout=120)
    assert (status["restarts"], status["disruptions"]) == (0, 0)
    assert "blockedSince" not in status


def test_quota_that_never_frees_up_fails_at_the_startup_timeout(jobs: Jobs) -> None:
    jobs.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
                "spec": {"hard": {"pods": "1"}}})
    jobs.apply(job("train", SLEEP, workers=2, health={"startupTimeoutSeconds": 8}))
    status = jobs.wait_phase("train", "Failed", timeout=90)
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "StartupTimeout"
    assert "refused by quota" in failed["message"]


def test_a_job_applied_before_its_service_account_waits_for_it_then_runs(jobs: Jobs) -> None:
    """`kubectl apply -f dir/` may create the job before its ServiceAccount (and a fresh
    namespace's "default" comes a moment after the namespace): a refusal that passes."""
    train = job("train", SLEEP, workers=2)
    train["spec"]["template"]["spec"]["serviceAccountName"] = "trainer"
    jobs.apply(train)
    status = jobs.wait("train", "a ServiceAccountMissing condition",
                       lambda s: s if (c := condition(s, "Running")) is not None
                       and c["reason"] == "ServiceAccountMissing" else None)
    message = condition(status, "Running")["message"]  # type: ignore[index]
    assert "service account does not exist" in message and '"trainer" not found' in message
    assert status.get("phase") != "Failed"
    jobs.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}})
    status = jobs.wait("train", "the whole group running", lambda s: s if s.get("phase") ==
                       "Running" else None, timeout=120)
    assert (status["restarts"], status["disruptions"]) == (0, 0)
    assert {p["spec"]["serviceAccountName"] for p in jobs.pods("train")} == {"trainer"}


def test_an_admission_denial_fails_at_once_with_the_servers_words(
    jobs: Jobs, cluster: Cluster
) -> None:
    cluster.kubectl("label", "namespace", jobs.namespace,
                    "pod-security.kubernetes.io/enforce=restricted")
    jobs.apply(job("train", SLEEP, workers=2))
    status = jobs.wait_phase("train", "Failed")
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "PodRefused"
    assert "refused worker-0's pod" in failed["message"] and "PodSecurity" in failed["message"]
    assert status["restarts"] == 0 and not jobs.pods("train")


def test_a_script_without_a_progress_server_is_not_hung(jobs: Jobs) -> None:
    """progressTimeoutSeconds set, but nothing serves /progress: detection is inactive and
    says so; nothing restarts."""
    jobs.apply(job("train", SLEEP, workers=2, health={"progressTimeoutSeconds": 4}))
    status = jobs.wait("train", "ProgressReporting=False", lambda s: s if (
        c := condition(s, "ProgressReporting")) is not None and c["status"] == "False" else None,
        timeout=90)
    reporting = condition(status, "ProgressReporting")
    assert reporting is not None and reporting["reason"] == "NoProgressServer"
    assert reporting["message"].startswith("hang detection is inactive: no worker of "
                                           "generation 0 has answered GET /progress")
    time.sleep(8)  # two more timeouts: still nothing may restart
    status = jobs.status("train")
    assert (status["phase"], status["restarts"], status["groupGeneration"]) == ("Running", 0, 0)


def test_a_job_recreated_under_the_same_name_starts_afresh(jobs: Jobs) -> None:
    jobs.apply(job("train", SLEEP, workers=2))
    jobs.wait_running("train")
    first = jobs.get("train")["metadata"]["uid"]  # type: ignore[index]
    jobs.kubectl("delete", "mwj", "train", "--wait=false")
    wait_for(lambda: jobs.get("train") is None, 30, describe="the job to go")
    jobs.apply(job("train", SLEEP, workers=2))
    status = jobs.wait_running("train")
    assert (status["restarts"], status["disruptions"], status["groupGeneration"]) == (0, 0, 0)
    second = jobs.get("train")["metadata"]["uid"]  # type: ignore[index]
    wait_for(lambda: all(p["metadata"]["ownerReferences"][0]["uid"] == second
                         for p in jobs.pods("train")), 60,
             describe="only the new job's pods")
    assert first != second


# --- nodes that stop answering: Node objects of the test's own, with no kubelet ---


def on_node(manifest: dict[str, object], node: FakeNode) -> dict[str, object]:
    spec = manifest["spec"]["template"]["spec"]  # type: ignore[index]
    spec["nodeSelector"] = {"mw-fake-node": node.name}
    spec["tolerations"] = [FakeNode.TOLERATION]
    spec["terminationGracePeriodSeconds"] = 1
    return manifest


def train_on(jobs: Jobs, node: FakeNode) -> None:
    """Job `train`: two workers bound to `node` (lost after 3 s of NotReady)."""
    jobs.apply(on_node(job("train", SLEEP, workers=2, health={"nodeLostSeconds": 3}), node))
    wait_for(lambda: len([p for p in jobs.pods("train") if p["spec"].get("nodeName")]) == 2,
             60, describe="both workers bound to the fake node")


def test_a_lost_node_restarts_the_group_and_only_then_are_its_pods_force_deleted(
    jobs: Jobs, fake_node: FakeNode,
) -> None:
    train_on(jobs, fake_node)
    # A user deletes a worker: on a live node its kubelet would stop it; here nobody does.
    jobs.kubectl("delete", "pod", "train-worker-1", "--wait=false")
    jobs.wait("train", "a restart for the deleted pod",
              lambda s: s if s.get("groupGeneration") == 1 else None)
    time.sleep(40)  # grace (1 s) + 30 s and more: the node is Ready, so no force-delete
    stale = [p for p in jobs.pods("train") if generation_of(p) == 0]
    assert len(stale) == 2 and all("deletionTimestamp" in p["metadata"] for p in stale)
    assert "StalePodForceDeleted" not in {r for _, r, _ in jobs.events("train")}
    running = condition(jobs.status("train"), "Running")
    assert running is not None and "pods of an earlier generation to terminate" in \
        running["message"]

    fake_node.set_ready(False)  # the node is cut off
    wait_for(lambda: not [p for p in jobs.pods("train") if generation_of(p) == 0], 90,
             describe=lambda: f"the stale pods to be force-deleted\n{jobs.describe('train')}")
    # The Event follows the force-delete: poll for it.
    forced = wait_for(lambda: [m for _, r, m in jobs.events("train")
                               if r == "StalePodForceDeleted"], 30,
                      describe="a StalePodForceDeleted Event")
    assert f"node {fake_node.name} is NotReady" in forced[0]
    status = jobs.status("train")  # the next group may land on the dead node once more
    assert status["disruptions"] >= 1 and status["restarts"] == 0


def test_a_worker_on_a_node_gone_notready_restarts_the_group_as_a_disruption(
    jobs: Jobs, fake_node: FakeNode,
) -> None:
    train_on(jobs, fake_node)
    fake_node.set_ready(False)
    status = jobs.wait("train", "a NodeLost restart", lambda s: s if s.get("groupGeneration")
                       == 1 else None, timeout=60)
    assert (status["disruptions"], status["restarts"]) == (1, 0)
    assert status["lastFailure"]["reason"] == "NodeLost"
    assert f"lost its node: node {fake_node.name} is NotReady" in \
        condition(status, "Restarting")["message"]  # type: ignore[index]


def test_a_node_notready_for_a_few_seconds_restarts_nothing(
    jobs: Jobs, fake_node: FakeNode,
) -> None:
    """A kubelet restart or a runtime hiccup: NotReady for 5 s, with the not-ready NoSchedule
    taint (which carries no time). With nodeLostSeconds 20 nothing restarts; before, the
    taint's unknown time counted as long ago and the group restarted at once."""
    jobs.apply(on_node(job("blip", SLEEP, workers=2, health={"nodeLostSeconds": 20}),
                       fake_node))
    wait_for(lambda: len([p for p in jobs.pods("blip") if p["spec"].get("nodeName")]) == 2,
             60, describe="both workers bound to the fake node")
    taint = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    fake_node.set_ready(False)
    jobs.cluster.kubectl("patch", "node", fake_node.name, "--type=merge",
                         "-p", json.dumps({"spec": {"taints": [FakeNode.TAINT, taint]}}))
    time.sleep(5)  # the blip's length is the case's subject
    fake_node.set_ready(True)
    jobs.cluster.kubectl("patch", "node", fake_node.name, "--type=merge",
                         "-p", json.dumps({"spec": {"taints": [FakeNode.TAINT]}}))
    deadline = time.monotonic() + 25  # past nodeLostSeconds after the blip began
    while time.monotonic() < deadline:
        status = jobs.status("blip")
        assert status.get("groupGeneration", 0) == 0 and status.get("disruptions", 0) == 0, \
            jobs.describe("blip")
        time.sleep(1)


def test_a_node_whose_lease_goes_silent_restarts_the_group_long_before_notready(
    jobs: Jobs, fake_node: FakeNode,
) -> None:
    """The node's kubelet renews its Lease every 5 s here (10 s in a real kubelet). A 5 s gap
    restarts nothing; a Lease silent for nodeLostSeconds restarts the group as a disruption
    while the node object still says Ready (NotReady would come 50 s after the last one).
    The new group is made away from the silent node; this one fits nowhere else, so the
    scheduler refuses it until the node renews its Lease again: the group is then placed again
    (its pods' affinity cannot change), without spending a restart or a disruption."""
    jobs.apply(on_node(job("silent", SLEEP, workers=2, health={"nodeLostSeconds": 10}),
                       fake_node))
    wait_for(lambda: len([p for p in jobs.pods("silent") if p["spec"].get("nodeName")]) == 2,
             60, describe="both workers bound to the fake node")
    wait_for(lambda: jobs.cluster.kubectl("-n", "kube-node-lease", "get", "lease",
                                          fake_node.name, check=False).returncode == 0,
             30, describe="the fake node's first Lease renewal")
    fake_node.alive.clear()
    time.sleep(5)  # the gap's length is the case's subject
    fake_node.alive.set()
    deadline = time.monotonic() + 20  # past nodeLostSeconds and a renewal interval
    while time.monotonic() < deadline:
        status = jobs.status("silent")
        assert status.get("groupGeneration", 0) == 0, jobs.describe("silent")
        time.sleep(1)

    fake_node.alive.clear()
    silenced = time.monotonic()
    status = jobs.wait("silent", "a restart for the silent Lease",
                       lambda s: s if s.get("groupGeneration") == 1 else None, timeout=45)
    print(f"\nsilent Lease -> group restarted in {time.monotonic() - silenced:.1f}s")
    assert (status["disruptions"], status.get("restarts", 0)) == (1, 0)
    assert status["lastFailure"]["reason"] == "NodeLost"
    assert f"node {fake_node.name} last renewed its Lease at" in \
        status["lastFailure"]["message"], status["lastFailure"]
    ready = jobs.cluster.kubectl("get", "node", fake_node.name, "-o",
                                 "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
    assert ready.stdout.strip() == "True"  # the node controller has not noticed yet

    # Generation 1 is made once generation 0 is gone. The operator force-deletes pods of a
    # silent node 30 s past their grace period (the test above); here an administrator does.
    jobs.kubectl("delete", "pods", "-l", "multiworker.dev/group-generation=0", "--force",
                 "--grace-period=0")

    def refused(pod: Obj) -> bool:
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                   for c in pod.get("status", {}).get("conditions", []))

    wait_for(lambda: [p for p in jobs.pods("silent") if generation_of(p) == 1 and refused(p)],
             60, describe="generation 1 refused by the scheduler: it avoids the one node it fits")
    fake_node.alive.set()
    status = jobs.wait("silent", "the group placed again", lambda s: s if s.get(
        "groupGeneration") == 2 else None, timeout=45)
    assert (status["disruptions"], status.get("restarts", 0)) == (1, 0)
    assert ("Normal", "AvoidedNodeBack") in [e[:2] for e in jobs.events("silent")], \
        jobs.describe("silent")
    wait_for(lambda: len([p for p in jobs.pods("silent")
                          if generation_of(p) == 2 and p["spec"].get("nodeName")]) == 2,
             60, describe="generation 2 bound to the node that came back")
