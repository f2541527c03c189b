"""Kueue admits MultiWorkerJobs: real Kueue (hack/cluster/kueue.sh, built from its Go module),
the real operator with `--kueue` and only the chart's RBAC for it, real TensorFlow workers.

Each test gets a ClusterQueue of its own that admits only its namespace, with a CPU quota for
one job of two 100m workers at a time (the quota is Kueue's accounting: the node has room for
more, so only Kueue can make a job wait)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multiworker.decide.queueing import FINALIZER

from tests.cluster import REPO, Cluster, one_setup_at_a_time, run_script
from tests.conftest import LOG_DIR
from tests.integration.conftest import OperatorProcess
from tests.integration.fake_nodes import FakeNode
from tests.integration.jobs import Jobs
from tests.integration.rbac import chart_identity
from tests.support import has_failed, wait_for

pytestmark = pytest.mark.usefixtures("worker_image")

TRAIN = "/opt/multiworker/examples/training/train.py"
KUEUE = "kueue.x-k8s.io/v1beta2"
QUEUE = "team"
WORKER_CPU = "100m"
PRIORITIES = {"mw-low": 100, "mw-high": 1000}
GPU, PRODUCT = "nvidia.com/gpu", "nvidia.com/gpu.product"


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> None:
    """Kueue running in the test cluster (idempotent: seconds when it already runs)."""
    with one_setup_at_a_time(f"{cluster.kind}-kueue"):
        run_script("hack/cluster/kueue.sh", *(["--kind"] if cluster.kind == "kind" else []),
                   env=cluster.env)
    for name, value in PRIORITIES.items():
        apply(cluster, {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                        "metadata": {"name": name}, "value": value})


def apply(cluster: Cluster, obj: dict[str, Any], namespace: str | None = None) -> None:
    where = ("-n", namespace) if namespace else ()
    cluster.kubectl(*where, "apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps(obj))


def flavor(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": labels or {}}}


def cluster_queue(name: str, namespace: str, flavors: list[tuple[str, str]]
                  ) -> dict[str, Any]:
    """Admits `namespace` only; (flavor, CPU quota) in the order Kueue tries them; a
    higher-priority job preempts a lower one."""
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
            {"name": f, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                      {"name": "memory", "nominalQuota": "8Gi"}]}
            for f, cpu in flavors]}]}}


@pytest.fixture
def queue(cluster: Cluster, namespace: str, kueue: None) -> Iterator[str]:
    """ClusterQueue cq-<namespace> (one job's worth of CPU), LocalQueue `team` in the test
    namespace; returns the ClusterQueue's name."""
    name = f"cq-{namespace}"[:63]
    apply(cluster, flavor("mw-default"))
    apply(cluster, cluster_queue(name, namespace, [("mw-default", "300m")]))
    apply(cluster, {"apiVersion": KUEUE, "kind": "LocalQueue",
                    "metadata": {"name": QUEUE, "namespace": namespace},
                    "spec": {"clusterQueue": name}}, namespace)
    yield name
    cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)


@pytest.fixture
def kueue_operator(cluster: Cluster, namespace: str, crds: None, tmp_path: Path,
                   request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The operator with --kueue, holding only what the chart grants with kueue.enabled."""
    identity = chart_identity(cluster, namespace, tmp_path, ("kueue.enabled=true",))
    process = OperatorProcess(env={**cluster.env, "KUBECONFIG": str(identity.kubeconfig)},
                              namespace=namespace, log_path=tmp_path / "operator.log",
                              extra=("--kueue",))
    process.start()
    yield process
    if has_failed(request):
        out = LOG_DIR / namespace
        out.mkdir(parents=True, exist_ok=True)
        (out / "operator.log").write_text(process.log_path.read_text(errors="replace"))
        print(f"---- operator log (tail; full log in {out / 'operator.log'}) ----")
        print(process.log_tail(100))
        print("---- Workloads ----")
        print(json.dumps(workloads(cluster, namespace), indent=1))
    # The jobs go while the operator still runs: it lets go of their Workloads.
    cluster.kubectl("-n", namespace, "delete", "mwj", "--all", "--wait=true", check=False)
    wait_for(lambda: not workloads(cluster, namespace), 60, describe=lambda: (
        "Workloads gone: " + json.dumps([w["metadata"] for w in workloads(cluster, namespace)])
        + f"\n{process.log_tail(40)}"))
    process.stop()
    identity.delete(cluster)


def workloads(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("-n", namespace, "get", "workloads.kueue.x-k8s.io", "-o", "json",
                          check=False).stdout
    return list(json.loads(out or '{"items": []}')["items"])


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), {})


def job(name: str, epochs: int, priority: str | None = None, step_sleep: float = 0.0,
        queue: str = QUEUE, checkpoint: bool = False) -> dict[str, Any]:
    """Two workers of the synthetic trainer (10 steps an epoch), 100m CPU each."""
    env = {"TRAIN_EPOCHS": str(epochs), "TRAIN_STEPS_PER_EPOCH": "10",
           "TRAIN_TARGET_LOSS": "1000", "TRAIN_STEP_SLEEP": str(step_sleep)}
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    spec: dict[str, Any] = {
        "workers": 2, "restartPolicy": {"maxRestarts": 0},
        "template": {"spec": {"terminationGracePeriodSeconds": 20, "containers": [{
            "name": "tensorflow", "image": "multiworker.local/worker:dev",
            "imagePullPolicy": "IfNotPresent", "args": ["python3", TRAIN],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"requests": {"cpu": WORKER_CPU, "memory": "256Mi"}}}]}}}
    if checkpoint:
        spec["checkpoint"] = {"claimName": "checkpoints"}
    return {"apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
            "metadata": {"name": name, "labels": labels}, "spec": spec}


def queued_reason(status: dict[str, Any]) -> dict[str, Any] | None:
    c = condition({"status": status}, "Queued")
    return c if c.get("status") == "True" and status.get("phase") == "Queued" else None


def test_a_job_waits_for_quota_with_kueues_reason_and_starts_when_the_first_finishes(
    cluster: Cluster, namespace: str, queue: str, kueue_operator: OperatorProcess,
    jobs: Jobs, record_property: Any,
) -> None:
    jobs.apply(job("nowhere", epochs=1, queue="no-such-queue"))
    jobs.apply(job("first", epochs=6, step_sleep=0.3))
    jobs.wait_running("first", timeout=180)
    jobs.apply(job("second", epochs=1))
    # Kueue's reason, not the operator's words while Kueue has given none yet ("waiting for
    # Kueue to reserve quota").
    waiting = jobs.wait("second", "Queued with Kueue's reason",
                        lambda s: c if (c := queued_reason(s)) and "insufficient" in c["message"]
                        else None, timeout=60)
    record_property("figure: a queued job's condition", waiting["message"])
    assert f"LocalQueue {QUEUE} (ClusterQueue {queue})" in waiting["message"], waiting
    assert "insufficient unused quota for cpu" in waiting["message"], waiting
    assert not jobs.pods("second")
    shown = jobs.kubectl("get", "mwj", "second").stdout
    assert "Queued" in shown, shown
    # A queue that does not exist: Kueue's words, no pod, one Workload, no loop.
    nowhere = jobs.wait("nowhere", "Queued naming the missing queue",
                        lambda s: c if (c := queued_reason(s)) and "doesn't exist" in
                        c["message"] else None)
    assert "LocalQueue no-such-queue doesn't exist" in nowhere["message"], nowhere
    # The operator killed while a job waits: it converges on the same Workload, never two.
    kueue_operator.kill()
    kueue_operator.start()
    first = jobs.wait_phase("first", "Succeeded", timeout=300)
    assert first["restarts"] == 0
    second = jobs.wait_running("second", timeout=120)
    admitted = condition({"status": second}, "Queued")
    assert admitted["reason"] == "Admitted" and queue in admitted["message"], admitted
    jobs.wait_phase("second", "Succeeded", timeout=300)
    assert not jobs.pods("nowhere")
    owners = [w["metadata"]["ownerReferences"][0]["name"] for w in workloads(cluster, namespace)]
    assert sorted(owners) == ["first", "nowhere", "second"], owners  # one Workload each
    done = {w["metadata"]["ownerReferences"][0]["name"]: w
            for w in workloads(cluster, namespace)}
    assert condition(done["first"], "Finished").get("reason") == "Succeeded"
    assert "kueue.x-k8s.io/resource-in-use" not in (
        done["first"]["metadata"].get("finalizers") or [])
    reasons = [reason for _, reason, _ in jobs.events("second")]
    assert "Admitted" in reasons, reasons


def test_a_job_deleted_while_the_operator_is_down_has_its_workload_let_go_on_its_return(
    cluster: Cluster, namespace: str, queue: str, kueue_operator: OperatorProcess, jobs: Jobs,
) -> None:
    """The garbage collector deletes a gone job's Workload, and waits on the operator's
    finalizer. The Workload's events reach a restarted operator before it leads the
    namespace (and a namespace with no job left is led by none): on taking the lead it sweeps
    its cache and lets go, so the Workload does not stay for ever."""
    jobs.apply(job("gone", epochs=1, queue="no-such-queue"))  # a Workload, never admitted
    held = wait_for(lambda: next((w for w in workloads(cluster, namespace) if FINALIZER in (
        w["metadata"].get("finalizers") or [])), None), 60, describe="the job's Workload")
    kueue_operator.kill()
    jobs.kubectl("delete", "mwj", "gone", "--wait=true")
    deleting = wait_for(lambda: next((w for w in workloads(cluster, namespace)
                                      if w["metadata"].get("deletionTimestamp")), None), 60,
                        describe="the garbage collector deleting the Workload")
    assert deleting["metadata"]["uid"] == held["metadata"]["uid"]
    assert FINALIZER in deleting["metadata"]["finalizers"]  # held for the operator
    kueue_operator.start()
    wait_for(lambda: not workloads(cluster, namespace), 60, describe=lambda: (
        "the Workload let go of: " + json.dumps([w["metadata"] for w in workloads(
            cluster, namespace)]) + f"\n{kueue_operator.log_tail(40)}"))


def test_an_elastic_job_admitted_in_part_trains_with_the_workers_the_quota_holds(
    cluster: Cluster, namespace: str, queue: str, kueue_operator: OperatorProcess,
    jobs: Jobs,
) -> None:
    """Kueue's partial admission: 4 workers of 100m, minWorkers 2, against a quota of
    300m. Kueue admits 3 (podSet minCount), and the group trains with 3 of 4 to the end,
    through the same Workload."""
    manifest = job("part", epochs=3)
    manifest["spec"]["workers"] = 4
    manifest["spec"]["elastic"] = {"minWorkers": 2}
    jobs.apply(manifest)
    jobs.wait_running("part", timeout=180)
    [workload] = workloads(cluster, namespace)
    pod_set = workload["spec"]["podSets"][0]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 2), pod_set
    assert workload["status"]["admission"]["podSetAssignments"][0]["count"] == 3
    admitted = [m for _, r, m in jobs.events("part") if r == "Admitted"]
    assert admitted and admitted[0].startswith("3 of 4 workers"), admitted
    status = jobs.wait_phase("part", "Succeeded", timeout=300)
    assert (status["totalWorkers"], status["size"], status["admittedWorkers"]) == \
        (3, "3/4", 3), status


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_from_its_sigterm_checkpoint(
    cluster: Cluster, namespace: str, queue: str, kueue_operator: OperatorProcess,
    jobs: Jobs, checkpoint_claim: str, record_property: Any,
) -> None:
    jobs.apply(job("low", epochs=30, priority="mw-low", step_sleep=0.1, checkpoint=True))
    # Training past its first epoch, in whatever generation: the subject is the preemption
    # (that nothing spent a restart is asserted at the end).
    before = jobs.wait("low", "progress past the first epoch",
                       lambda s: s if ((s.get("progress") or {}).get("step") or 0) > 20
                       else None, timeout=300)
    polled = before["progress"]["step"]
    jobs.apply(job("high", epochs=2, priority="mw-high"))
    # The operator killed as the preemption begins: a restarted one finishes it.
    # (Timeouts for a loaded CI machine: the figure is recorded, not asserted.)
    jobs.wait("low", "evicted", lambda s: s if s.get("phase") == "Queued" else None, timeout=120)
    kueue_operator.kill()
    kueue_operator.start()
    evicted_at = time.monotonic()
    wait_for(lambda: not jobs.pods("low"), 120, describe=lambda: jobs.describe("low"))
    (low_workload,) = [w for w in workloads(cluster, namespace)
                       if w["metadata"]["ownerReferences"][0]["name"] == "low"]
    assert condition(low_workload, "Evicted").get("reason") == "Preempted", low_workload
    jobs.wait_running("high", timeout=240)
    record_property("figure: preemption to the high job Running (s)",
                    round(time.monotonic() - evicted_at, 1))
    reasons = [reason for _, reason, _ in jobs.events("low")]
    assert "Preempted" in reasons and "Requeued" in reasons, reasons
    jobs.wait_phase("high", "Succeeded", timeout=300)
    final = jobs.wait_phase("low", "Succeeded", timeout=600)
    resumed = (final.get("progress") or {}).get("resumedFromStep") or 0
    # The group saved on SIGTERM: it resumed at or after the last step polled before it.
    record_property("figure: preempted job: last step polled before / resumed from",
                    f"{polled} / {resumed}")
    assert resumed >= polled, (resumed, polled, final)
    assert final["restarts"] == 0, final  # a preemption spends no restart
    assert final["groupGeneration"] >= 1, final


def test_two_gpu_products_as_two_flavors_place_every_worker_on_the_admitted_ones(
    cluster: Cluster, namespace: str, kueue: None, kueue_operator: OperatorProcess,
    jobs: Jobs,
) -> None:
    """Two GPU products on two nodes (with no kubelet: pods bound there never run), one
    ResourceFlavor each. The first flavor's quota holds 1 GPU, the job needs 2, so Kueue admits
    it with the second, whose node labels and toleration reach both workers: they are bound to
    that product's node, although the other has as many free GPUs."""
    suffix = namespace[-5:]
    products = {"first": f"mw-gpu-a-{suffix}", "second": f"mw-gpu-b-{suffix}"}
    nodes = {k: FakeNode(cluster, {PRODUCT: v}, gpus=4) for k, v in products.items()}
    flavors = {k: f"mw-{k}-{suffix}" for k in products}
    toleration = FakeNode.TOLERATION  # the flavor's: without it no worker could land there
    name = f"cq-{namespace}"[:63]
    try:
        for node in nodes.values():
            node.create()
        for k, product in products.items():
            apply(cluster, {**flavor(flavors[k]), "spec": {
                "nodeLabels": {PRODUCT: product}, "tolerations": [toleration]}})
        apply(cluster, {**cluster_queue(name, namespace, []), "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [
                {"name": flavors[k], "resources": [
                    {"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "8Gi"},
                    {"name": GPU, "nominalQuota": gpus}]}
                for k, gpus in (("first", 1), ("second", 4))]}]}})
        apply(cluster, {"apiVersion": KUEUE, "kind": "LocalQueue",
                        "metadata": {"name": QUEUE, "namespace": namespace},
                        "spec": {"clusterQueue": name}}, namespace)
        manifest = job("placed", epochs=1)
        container = manifest["spec"]["template"]["spec"]["containers"][0]
        container["resources"]["limits"] = {GPU: 1}
        jobs.apply(manifest)
        second = nodes["second"].name

        def bound() -> list[dict[str, Any]] | None:
            pods = jobs.pods("placed")
            return pods if len(pods) == 2 and all(
                p["spec"].get("nodeName") for p in pods) else None
        pods = wait_for(bound, 120, describe=lambda: jobs.describe("placed"))
        for pod in pods:
            spec = pod["spec"]
            assert spec["nodeName"] == second, spec.get("nodeName")
            assert spec["nodeSelector"][PRODUCT] == products["second"]
            assert toleration in spec["tolerations"]
        admitted = condition({"status": jobs.status("placed")}, "Queued")
        assert flavors["second"] in admitted["message"], admitted
    finally:
        cluster.kubectl("-n", namespace, "delete", "mwj", "--all", "--wait=false", check=False)
        for node in nodes.values():
            node.delete()
        cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)
        for f in flavors.values():
            cluster.kubectl("delete", "resourceflavor", f, "--wait=false", check=False)


def test_the_worked_example_is_accepted_by_kueue_and_the_api_server(
        cluster: Cluster, kueue: None, crds: None) -> None:
    """examples/kueue/ as the README applies it, checked by the API server and Kueue's
    webhooks (server-side dry run: nothing is created)."""
    for manifest in ("examples/kueue/queues.yaml", "examples/kueue/job.yaml"):
        cluster.kubectl("apply", "--dry-run=server", "-f", str(REPO / manifest))
