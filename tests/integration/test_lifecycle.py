"""A job's life on a real cluster with the real operator: create, fail, restart, finish."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import (
    Jobs,
    condition,
    env_of,
    fail_once,
    generation_of,
    job,
)
from tests.support import USES_NODE_GPUS, wait_for

pytestmark = pytest.mark.usefixtures("images", "operator")

SLEEP = "exec sleep 3600"


@USES_NODE_GPUS
def test_create_makes_headless_service_and_workers(jobs: Jobs) -> None:
    ns = jobs.namespace
    manifest = job("train", SLEEP, workers=3, port=2345)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    jobs.apply(manifest)
    status = jobs.wait_running("train")
    assert status["ready"] == "3/3" and status["restarts"] == 0
    assert condition(status, "Running")["status"] == "True"  # type: ignore[index]

    pods = jobs.pods("train")
    assert [p["metadata"]["name"] for p in pods] == [f"train-worker-{i}" for i in range(3)]
    addresses = [f"train-worker-{i}.train.{ns}.svc:2345" for i in range(3)]
    for index, pod in enumerate(pods):
        assert pod["spec"]["hostname"] == f"train-worker-{index}"
        assert pod["spec"]["subdomain"] == "train"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["metadata"]["labels"]["multiworker.dev/worker-index"] == str(index)
        assert generation_of(pod) == 0
        [owner] = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "MultiWorkerJob" and owner["controller"] is True
        env = env_of(pod)
        # As the process sees it: the kubelet expanded the pod's reference to the ConfigMap.
        seen = jobs.kubectl("exec", f"train-worker-{index}", "--", "printenv",
                            "TF_CONFIG").stdout
        assert json.loads(seen) == {
            "cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        assert "$(MWJ_WORKER_ADDRESSES)" in env["TF_CONFIG"]  # the pod carries no list
        assert env["MWJ_NUM_WORKERS"] == "3" and env["MWJ_RESTART_COUNT"] == "0"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] in (1, "1")

    service = jobs.core.read_namespaced_service("train", ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses

    # The names in TF_CONFIG resolve inside the pods (CoreDNS + the headless Service).
    lookup = f"import socket; print(socket.gethostbyname('train-worker-2.train.{ns}.svc'))"
    pod_ip = pods[2]["status"]["podIP"]
    wait_for(lambda: jobs.kubectl("exec", "train-worker-0", "--", "python3", "-c", lookup,
                                  check=False).stdout.strip() == pod_ip,
             60, describe=f"train-worker-2's DNS name to resolve to {pod_ip}")

    columns = jobs.kubectl("get", "mwj", "train").stdout
    assert "Running" in columns and "3/3" in columns


def test_failed_worker_restarts_the_whole_group(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.apply(job("train", fail_once(index=1, code=1), workers=3,
                   restartPolicy={"backoffSeconds": 1}))
    jobs.wait_running("train")
    first_uids = {p["metadata"]["uid"] for p in jobs.pods("train")}
    status = jobs.wait_running("train", generation=1)
    assert (status["restarts"], status["disruptions"]) == (1, 0)
    assert status["lastFailure"]["worker"] == 1 and status["lastFailure"]["exitCode"] == 1
    assert status["lastRecoverySeconds"] > 0
    # The history, through the CRD's schema (a field it lacked would be pruned).
    first, second = status["history"]
    assert (first["generation"], first["path"], first["reason"], first["workers"]) == \
        (0, "Created", "Error", 3)
    assert (second["generation"], second["path"]) == (1, "Recreate")
    assert first["ended"] == second["started"] and second["running"] is not None
    assert {"resizes", "roomWorkers", "stragglers"}.isdisjoint(status)  # what the job uses
    pods = jobs.pods("train")
    assert len(pods) == 3 and {generation_of(p) for p in pods} == {1}
    assert not first_uids & {p["metadata"]["uid"] for p in pods}  # every worker is new
    assert {env_of(p)["MWJ_RESTART_COUNT"] for p in pods} == {"1"}
    warnings = [e for e in jobs.events("train") if e[0] == "Warning"]
    assert ("Warning", "WorkerFailed",
            "restarting group: worker-1 exited 1 (Error); restart 1 of 3 in 1s") in warnings
    assert 'multiworker_group_restarts_total{counted="true",reason="Error"} 1.0' in \
        operator.metrics()


def test_deleted_worker_restarts_without_spending_the_budget(jobs: Jobs) -> None:
    jobs.apply(job("train", SLEEP, workers=2))
    jobs.wait_running("train")
    jobs.kubectl("delete", "pod", "train-worker-1", "--wait=false")
    status = jobs.wait_running("train", generation=1)
    assert (status["restarts"], status["disruptions"]) == (0, 1)
    assert status["lastFailure"]["reason"] == "Deleted"
    assert status["lastFailure"]["action"] == "RestartGroupWithoutCounting"


def test_fail_fast_exit_code_fails_the_job(jobs: Jobs) -> None:
    jobs.apply(job("train", fail_once(index=2, code=2), workers=3,
                   restartPolicy={"onExitCodes": [{"action": "FailJob", "values": [2]}]}))
    jobs.kubectl("wait", "--for=condition=Failed", "mwj/train", "--timeout=90s")
    status = jobs.status("train")
    assert status["phase"] == "Failed" and status["restarts"] == 0
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "ExitCodeFailsJob"
    assert failed["message"].startswith("worker-2 exited 2")


def test_exhausted_budget_fails_the_job(jobs: Jobs) -> None:
    always_fails = 'if [ "$MWJ_WORKER_INDEX" = 0 ]; then sleep 1; exit 3; fi; exec sleep 3600'
    jobs.apply(job("train", always_fails, workers=2,
                   restartPolicy={"maxRestarts": 1, "backoffSeconds": 0}))
    status = jobs.wait_phase("train", "Failed")
    assert status["restarts"] == 1 and status["groupGeneration"] == 1
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "RestartLimitExceeded"
    assert "restart limit reached (1 of 1 restarts spent)" in failed["message"]
    # The failed worker stays for its logs; the other one is stopped.
    wait_for(lambda: [p["metadata"]["name"] for p in jobs.pods("train")
                      if "deletionTimestamp" not in p["metadata"]] == ["train-worker-0"],
             60, describe=lambda: jobs.describe("train"))


def test_chief_success_succeeds_the_job(jobs: Jobs) -> None:
    chief_finishes = 'if [ "$MWJ_WORKER_INDEX" = 0 ]; then sleep 2; exit 0; fi; exec sleep 3600'
    jobs.apply(job("train", chief_finishes, workers=3))
    jobs.kubectl("wait", "--for=condition=Succeeded", "mwj/train", "--timeout=90s")
    status = jobs.status("train")
    assert status["phase"] == "Succeeded" and status["completionTime"]
    running = condition(status, "Running")
    assert running is not None and running["status"] == "False"
    wait_for(lambda: [p["metadata"]["name"] for p in jobs.pods("train")] == ["train-worker-0"],
             60, describe=lambda: jobs.describe("train"))


def test_ttl_after_finished_deletes_the_job(jobs: Jobs) -> None:
    jobs.apply(job("train", "exit 0", workers=1, ttlSecondsAfterFinished=1))
    wait_for(lambda: jobs.get("train") is None, 90, describe=lambda: jobs.describe("train"))
    wait_for(lambda: not jobs.pods("train"), 60, describe="the job's pods to be collected")


def test_suspend_and_resume(jobs: Jobs) -> None:
    jobs.apply(job("train", SLEEP, workers=2))
    jobs.wait_running("train")
    jobs.patch_spec("train", suspend=True)
    jobs.wait_phase("train", "Suspended")
    wait_for(lambda: not jobs.pods("train"), 60, describe=lambda: jobs.describe("train"))
    jobs.patch_spec("train", suspend=False)
    status = jobs.wait_running("train", generation=1)
    assert status["restarts"] == 0
    suspended = condition(status, "Suspended")
    assert suspended is not None and suspended["status"] == "False"


def test_delete_removes_everything_the_job_owns(jobs: Jobs) -> None:
    jobs.apply(job("train", SLEEP, workers=2))
    jobs.wait_running("train")
    jobs.kubectl("delete", "mwj", "train", "--wait=true", "--timeout=60s")
    wait_for(lambda: not jobs.pods("train"), 60, describe="the job's pods to be collected")
    wait_for(lambda: not jobs.kubectl("get", "service", "train", "--ignore-not-found").stdout,
             60, describe="the job's Service to be collected")


@USES_NODE_GPUS
def test_unschedulable_worker_fails_after_the_startup_timeout(jobs: Jobs) -> None:
    manifest = job("train", SLEEP, workers=2, health={"startupTimeoutSeconds": 3})
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    most = max(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in jobs.cluster.nodes())
    container["resources"] = {"limits": {"nvidia.com/gpu": most + 1}}  # more than any node has
    jobs.apply(manifest)
    status = jobs.wait_phase("train", "Failed")
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "StartupTimeout"
    assert "could not start within 3s (Unschedulable:" in failed["message"]
    assert "Insufficient nvidia.com/gpu" in failed["message"]


def test_pod_the_api_server_rejects_fails_the_job(jobs: Jobs) -> None:
    manifest = job("train", SLEEP, workers=2)
    manifest["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    jobs.apply(manifest)  # the CRD checks only what the operator relies on
    status = jobs.wait_phase("train", "Failed")
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "InvalidPodTemplate"
    assert "the API server rejected worker-0's pod" in failed["message"]
    assert "Not_A_DNS_Label" in failed["message"]


def test_checkpoint_volume_survives_a_group_restart(jobs: Jobs) -> None:
    """Every generation mounts the same claim: what generation 0 wrote, generation 1 reads."""
    volume = f"mwj-{jobs.namespace}"[:63]
    shared = jobs.cluster.shared_dir or "/tmp"  # seen alike by every node (kind: on several)
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt"},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                      "volumeName": volume, "resources": {"requests": {"storage": "1Mi"}}}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
          "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteMany"],
                   "storageClassName": "", "persistentVolumeReclaimPolicy": "Delete",
                   "hostPath": {"path": f"{shared}/{volume}", "type": "DirectoryOrCreate"}}}
    script = """
        mkdir -p "$MWJ_CHECKPOINT_DIR"
        echo "generation $MWJ_RESTART_COUNT worker $MWJ_WORKER_INDEX" >> "$MWJ_CHECKPOINT_DIR/log"
        if [ "$MWJ_WORKER_INDEX" = 0 ] && [ "$MWJ_RESTART_COUNT" = 0 ]; then
          # fail only once worker 1 has written: on a loaded node it may start seconds later
          for i in $(seq 120); do grep -q "worker 1" "$MWJ_CHECKPOINT_DIR/log" && break; sleep 1; done
          exit 1
        fi
        exec sleep 3600
    """
    try:
        jobs.cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
        jobs.apply(claim)
        jobs.apply(job("train", script, workers=2, restartPolicy={"backoffSeconds": 0},
                       checkpoint={"claimName": "ckpt", "mountPath": "/ckpt"}))
        jobs.wait_running("train", generation=1)
        uid = (jobs.get("train") or {})["metadata"]["uid"]
        own = f"/ckpt/{jobs.namespace}/train-{uid}"  # the job's own directory on the claim
        assert {env_of(p)["MWJ_CHECKPOINT_DIR"] for p in jobs.pods("train")} == {own}
        written = jobs.kubectl("exec", "train-worker-1", "--", "cat", f"{own}/log").stdout
        assert set(written.splitlines()) == {
            f"generation {g} worker {w}" for g in (0, 1) for w in (0, 1)}
    finally:
        jobs.kubectl("delete", "mwj", "train", "--ignore-not-found", "--wait=true")
        jobs.kubectl("delete", "pvc", "ckpt", "--ignore-not-found", "--wait=false")
        jobs.cluster.kubectl("delete", "pv", volume, "--ignore-not-found", "--wait=false")
        jobs.cluster.remove_shared(volume)


def test_worker_network_policy_admits_the_workers_and_the_operator(
    jobs: Jobs, operator: OperatorProcess,
) -> None:
    """--worker-network-policy (the chart's workerNetworkPolicy.enabled): the API server takes
    the job's NetworkPolicy, the chart's RBAC suffices, and the job runs. (Whether it is
    enforced is the network plugin's business: the local cluster's bridge does not.)"""
    operator.stop()
    operator.extra = ("--worker-network-policy", "--operator-namespace", "multiworker-system")
    operator.start()
    jobs.apply(job("guarded", SLEEP, workers=2))
    jobs.wait_running("guarded")
    policy = json.loads(jobs.kubectl("get", "networkpolicy", "guarded-workers", "-o",
                                     "json").stdout)
    owner = policy["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("MultiWorkerJob", "guarded")
    workers = {"matchLabels": {"multiworker.dev/job-name": "guarded"}}
    assert policy["spec"]["podSelector"] == workers
    peers, from_operator = policy["spec"]["ingress"]
    assert peers["from"] == [{"podSelector": workers}]
    # The progress port and the in-place restart agent's.
    assert from_operator["ports"] == [{"port": 8471, "protocol": "TCP"},
                                      {"port": 8472, "protocol": "TCP"}]
    assert from_operator["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "multiworker-system"}
