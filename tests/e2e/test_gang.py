"""Gang scheduling with real pods on one 4-GPU node: a group is placed whole or not at all (the
coscheduling scheduler, PodGroups), preemption tears a whole group down as a disruption, and a
cluster without the PodGroup CRD gets a clear condition instead of a crash.

Each job's workers ask for one nvidia.com/gpu and are pinned to the same node (`gpu_node`: the
local cluster's only node, or kind's first worker), so two 3-worker jobs cannot both fit on its
four. `gang_scheduler` turns the coscheduling scheduler on (`up.sh --gang`, on kind
`gang.sh --kind`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster import BIN, REPO, Cluster, one_setup_at_a_time, run_script
from tests.e2e.test_recovery import tf_job, wait_checkpointed
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import TERMINAL, Jobs, condition, job
from tests.support import USES_NODE_GPUS, free_ports, wait_for

# Every test here takes the node's GPUs or waits for all of them (free_gpus).
pytestmark = USES_NODE_GPUS

GPU = "nvidia.com/gpu"
NODE_GPUS = 4
SCHEDULER = "scheduler-plugins-scheduler"
PG_GROUP, PG_VERSION, PG_PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
PG_CRD = f"{PG_PLURAL}.{PG_GROUP}"
POD_GROUP_LABEL = f"{PG_GROUP}/pod-group"
# Worker 0 (the chief) runs until the test touches /tmp/finish in it, then exits 0: the job
# succeeds and its GPUs come free exactly when the test says so. The other workers leave at
# once when the operator deletes them (a sleeping PID 1 would hold its GPU the whole grace
# period).
UNTIL_FINISHED = """
    if [ "$MWJ_WORKER_INDEX" = 0 ]; then
      until [ -e /tmp/finish ]; do sleep 0.2; done
      exit 0
    fi
    trap 'exit 0' TERM
    sleep 3600 & wait
"""


@pytest.fixture(scope="session")
def gang_scheduler(cluster: Cluster) -> str:
    """The coscheduling scheduler and the PodGroup CRD: started on the local cluster, required
    (not installed) on any other."""
    if cluster.kind == "local":
        with one_setup_at_a_time(cluster.kind):
            run_script("hack/cluster/up.sh", "--gang")
    elif cluster.kind == "kind":
        with one_setup_at_a_time(cluster.kind):
            run_script("hack/cluster/gang.sh", "--kind", env=cluster.env)
    elif cluster.kubectl("get", "crd", PG_CRD, check=False).returncode != 0:
        pytest.skip(f"needs the scheduler-plugins coscheduling scheduler ({SCHEDULER}) and its "
                    f"PodGroup CRD; only the local and kind clusters install them themselves")
    return SCHEDULER


@pytest.fixture(scope="session")
def gpu_node(cluster: Cluster) -> str:
    """The node every GPU job of these tests is pinned to: the first with exactly 4 GPUs."""
    for node in cluster.nodes():
        name = node["metadata"]["name"]
        if name in cluster.schedulable_workers() and \
                node["status"].get("allocatable", {}).get(GPU) == str(NODE_GPUS):
            return name
    raise AssertionError(f"no schedulable node of the {cluster.kind} cluster has {NODE_GPUS} GPUs")


@pytest.fixture
def free_gpus(cluster: Cluster, gpu_node: str) -> None:
    """Start from an idle node: pods of earlier tests may still be terminating."""
    core = client.CoreV1Api(cluster.api_client())

    def holders() -> list[str]:
        pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
                if gpus_of(p) and p["spec"].get("nodeName") == gpu_node
                and p["status"].get("phase") not in TERMINAL]

    wait_for(lambda: not holders() or None, 120,
             describe=lambda: f"all {NODE_GPUS} GPUs of {gpu_node} to be free; held by {holders()}")


NOT_DECISIONS = ("Updating pod condition", "Waited before sending request", "event_broadcaster")


def coscheduler_log(cluster: Cluster, namespace: str, lines: int = 30) -> str:
    """The coscheduler's last decisions about `namespace`'s pods (gang.sh logs them at -v=3):
    which plugin turned each down, and which queue it went to."""
    log = REPO / ".cluster" / "logs" / f"{'kind-' if cluster.kind == 'kind' else ''}coscheduler.log"
    if not log.exists():
        return f"(no {log})"
    with log.open(errors="replace") as f:
        mine = [line.rstrip()[:400] for line in f if f"{namespace}/" in line
                and not any(noise in line for noise in NOT_DECISIONS)]
    return "coscheduler log:\n" + "\n".join(mine[-lines:])


def gpus_of(pod: dict[str, Any]) -> int:
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU, 0))
               for c in pod["spec"]["containers"])


def gpu_job(name: str, gang: bool, script: str = UNTIL_FINISHED, workers: int = 3,
            node: str | None = None, schedule_timeout: int = 5, **spec: Any) -> dict[str, Any]:
    """Workers that each hold one GPU, on `node` when given."""
    manifest = job(name, script, workers=workers,
                   gang={"enabled": gang, "scheduleTimeoutSeconds": schedule_timeout},
                   # Waiting for capacity must not fail these jobs while the test runs.
                   health={"startupTimeoutSeconds": 900}, **spec)
    if node:
        pin_to(manifest, node)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "50m"}, "limits": {GPU: "1"}}
    return manifest


def pin_to(manifest: dict[str, Any], node: str) -> None:
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}


def finish(jobs: Jobs, name: str) -> None:
    """Makes worker 0 of `name` exit 0 (UNTIL_FINISHED), and waits until it has (or until its
    pod is gone: the operator cleans up a finished job).

    The exec's own status is not the test: worker 0 exits within 0.2 s of the touch, and the
    kubelet may kill the exec's process with the container (exit 137, seen in CI)."""
    pod = f"{name}-worker-0"
    jobs.kubectl("exec", pod, "-c", "tensorflow", "--", "touch", "/tmp/finish", check=False)

    def exited() -> bool:
        found = next((p for p in jobs.pods(name) if p["metadata"]["name"] == pod), None)
        if found is None:
            return True
        statuses = (found.get("status") or {}).get("containerStatuses") or []
        return any(c["name"] == "tensorflow" and c["state"].get("terminated", {}).get(
            "exitCode") == 0 for c in statuses)
    wait_for(exited, 60, describe=lambda: f"{pod} to exit 0\n{jobs.describe(name)}")


def pod_group(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = jobs.custom.get_namespaced_custom_object(
            PG_GROUP, PG_VERSION, jobs.namespace, PG_PLURAL, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


def bound(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]


def tried_by_scheduler(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "PodScheduled" and c["status"] == "False"
               for c in pod["status"].get("conditions", []))


def watch_unbound(jobs: Jobs, name: str, until: Callable[[dict[str, Any]], Any],
                  what: str, timeout: float = 120) -> Any:
    """Poll until `until(status)`; at every poll, none of the job's pods may be bound."""
    def check() -> Any:
        pods = jobs.pods(name)
        assert not bound(pods), f"{name}'s gang was partly placed: {bound(pods)} bound"
        return until(jobs.status(name))
    return wait_for(check, timeout, describe=lambda: f"{what}\n{jobs.describe(name)}")


def waiting_for_gang(status: dict[str, Any], *words: str) -> dict[str, Any] | None:
    """The status when its Running condition is False for WaitingForGang (and names `words`)."""
    running = condition(status, "Running")
    if not running or running["status"] != "False" or running["reason"] != "WaitingForGang":
        return None
    return status if all(w in running["message"] for w in words) else None


@pytest.mark.usefixtures("gang_scheduler", "operator", "free_gpus", "images")
def test_gang_waits_whole_and_starts_whole(cluster: Cluster, jobs: Jobs, gpu_node: str) -> None:
    jobs.apply(gpu_job("a", gang=False, node=gpu_node))
    jobs.wait_running("a")
    # The members that fit wait at Permit for their siblings this long: longer than the
    # coscheduler's retry of a member it set aside (20 s, gang.sh), so the group is not
    # rejected over and over while one member waits for that retry (seen in CI: b's three
    # workers never all tried at once within 120 s after a finished).
    jobs.apply(gpu_job("b", gang=True, node=gpu_node, schedule_timeout=30))

    # The message names what is missing and who holds it: a's three GPUs.
    holder = "job a 3"  # the job's own namespace: named without it
    status = watch_unbound(jobs, "b", lambda s: waiting_for_gang(s, "whole group", GPU, holder),
                           "b waiting for its whole group, naming the GPUs a holds")
    assert "0 of 3 workers bound" in condition(status, "Running")["message"]
    group = pod_group(jobs, "b-g0")
    assert group is not None, "no PodGroup for b's generation 0"
    assert group["spec"]["minMember"] == 3
    assert group["metadata"]["ownerReferences"][0]["name"] == "b"
    pods = jobs.pods("b")
    assert [p["spec"]["schedulerName"] for p in pods] == [SCHEDULER] * 3
    assert [p["metadata"]["labels"][POD_GROUP_LABEL] for p in pods] == ["b-g0"] * 3
    # Every worker has been tried and turned down, and none holds a GPU meanwhile.
    watch_unbound(jobs, "b", lambda _: all(tried_by_scheduler(p) for p in jobs.pods("b")),
                  "the scheduler to have tried every worker of b")

    finish(jobs, "a")
    jobs.wait_phase("a", "Succeeded")
    wait_for(lambda: not [p for p in jobs.pods("a") if p["status"].get("phase") not in TERMINAL]
             or None, 60, describe=lambda: f"a's pods gone\n{jobs.describe('a')}")
    # The coscheduler does not retry a group it last turned down at Permit when other pods
    # leave (Coscheduling wakes only on new pods and PodGroup changes): its periodic retry of
    # unschedulable pods places b (20 s in gang.sh, checked every 30 s; seen 42 s after a's pods
    # were gone).
    try:
        status = jobs.wait_running("b", generation=0, timeout=150)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{coscheduler_log(cluster, jobs.namespace)}") from None
    assert status["restarts"] == 0 and status.get("disruptions", 0) == 0, status
    assert len(bound(jobs.pods("b"))) == 3


@pytest.mark.usefixtures("gang_scheduler", "operator", "free_gpus", "images")
def test_without_gang_a_partly_placed_group_says_who_holds_what(jobs: Jobs, gpu_node: str) -> None:
    jobs.apply(gpu_job("a", gang=False, node=gpu_node))
    jobs.wait_running("a")
    jobs.apply(gpu_job("b", gang=False, node=gpu_node))

    # The scheduler turns b's workers down one by one: the first report may count one of
    # the two (seen in CI: "1 of 3"), so wait for the report that counts both.
    def reported(status: dict[str, Any]) -> dict[str, Any] | None:
        running = condition(status, "Running")
        return status if running and running["reason"] == "Unschedulable" \
            and "job a " in running["message"] \
            and "2 of 3 workers cannot be scheduled" in running["message"] else None

    status = jobs.wait("b", "b to report both unplaced workers and what holds the GPUs",
                       reported, timeout=120)
    message = condition(status, "Running")["message"]
    assert "job a 3" in message, message  # a holds three GPUs
    assert f"holding 1 {GPU}" in message, message  # b's one placed worker holds the fourth
    pods = jobs.pods("b")
    assert len(bound(pods)) == 1, bound(pods)
    assert all(p["spec"]["schedulerName"] == "default-scheduler" for p in pods)
    assert not any(POD_GROUP_LABEL in p["metadata"]["labels"] for p in pods)
    assert pod_group(jobs, "b-g0") is None

    finish(jobs, "a")
    jobs.wait_running("b", generation=0, timeout=120)


@pytest.fixture
def priority_classes(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A low and a high PriorityClass of this test alone (cluster-scoped objects)."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"mwj-e2e-low-{suffix}", f"mwj-e2e-high-{suffix}")
    for name, value in zip(names, (100, 1000), strict=True):
        cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority",
        }))
    yield names
    cluster.kubectl("delete", "priorityclass", *names, "--wait=false", check=False)


@pytest.mark.usefixtures("gang_scheduler", "operator", "free_gpus", "worker_image", "images")
def test_preempted_gang_restarts_whole_as_a_disruption_and_resumes(
    jobs: Jobs, checkpoint_claim: str, priority_classes: tuple[str, str], gpu_node: str
) -> None:
    low, high = priority_classes
    victim = tf_job("victim", workers=3, env={"TRAIN_STEP_SLEEP": "0.2"},
                    gang={"enabled": True, "scheduleTimeoutSeconds": 5},
                    health={"startupTimeoutSeconds": 900})
    pin_to(victim, gpu_node)
    pod_spec = victim["spec"]["template"]["spec"]
    pod_spec["priorityClassName"] = low
    pod_spec["containers"][0]["resources"]["limits"] = {GPU: "1"}
    jobs.apply(victim)
    wait_checkpointed(jobs, "victim")

    urgent = gpu_job("urgent", gang=True, node=gpu_node)
    urgent["spec"]["template"]["spec"]["priorityClassName"] = high
    jobs.apply(urgent)

    # The urgent gang preempts; the victim's whole group goes and its next generation waits
    # whole until the urgent job is done.
    status = jobs.wait("victim", "the victim's group to be torn down and wait whole",
                       lambda s: s if s.get("groupGeneration", 0) >= 1 and waiting_for_gang(s)
                       else None, timeout=180)
    assert (status.get("lastFailure") or {}).get("reason") == "Preempted", status
    jobs.wait_running("urgent", timeout=180)
    assert not bound(jobs.pods("victim")), "the victim's new group was partly placed"

    finish(jobs, "urgent")
    status = jobs.wait_phase("victim", "Succeeded", timeout=420)
    assert status["restarts"] == 0, status
    assert status["disruptions"] >= 1, status
    assert (status.get("progress") or {}).get("resumedFromStep", 0) > 0, status


# ---- a cluster without the PodGroup CRD: a private control plane of this test alone ----


@pytest.fixture
def bare_api_server(cluster: Cluster, tmp_path: Path) -> Iterator[Cluster]:
    """An etcd and a kube-apiserver of our own, with the MultiWorkerJob CRD and nothing else.

    The shared cluster has the PodGroup CRD installed (and other tests use it), so it cannot
    show a cluster without one; this API server is really without it (discovery has no
    scheduling.x-k8s.io). No nodes and no scheduler: pods it accepts are never placed.
    """
    if cluster.kind != "local":
        pytest.skip("builds its API server from the local cluster's binaries and certificates")
    pki = REPO / ".cluster" / "pki"
    etcd_port, peer_port, api_port = free_ports(3)
    logs = tmp_path / "bare"
    logs.mkdir()
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        with (logs / f"{name}.log").open("wb") as log:
            processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    start("etcd", shutil.which("etcd") or "etcd", "--data-dir", str(tmp_path / "etcd"),
          "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
          "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
          "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
          "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
          "--initial-cluster", f"default=http://127.0.0.1:{peer_port}")
    start("kube-apiserver", str(BIN / "kube-apiserver"),
          "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
          "--bind-address", "127.0.0.1", "--secure-port", str(api_port),
          "--advertise-address", "10.88.0.1", "--endpoint-reconciler-type", "none",
          "--tls-cert-file", str(pki / "apiserver.crt"),
          "--tls-private-key-file", str(pki / "apiserver.key"),
          "--client-ca-file", str(pki / "ca.crt"), "--authorization-mode", "RBAC",
          "--service-cluster-ip-range", "10.96.0.0/16",  # the local cluster's: guarded (ranges.sh)
          "--service-account-key-file", str(pki / "sa.pub"),
          "--service-account-signing-key-file", str(pki / "sa.key"),
          "--service-account-issuer", "https://kubernetes.default.svc.cluster.local")
    kubeconfig = tmp_path / "bare.kubeconfig"
    config = cluster.kubeconfig.read_text().replace(
        "https://127.0.0.1:6443", f"https://127.0.0.1:{api_port}")
    assert str(api_port) in config, "the local kubeconfig does not point at 127.0.0.1:6443"
    kubeconfig.write_text(config)
    bare = Cluster.for_kind("bare", kubeconfig)
    try:
        wait_for(lambda: bare.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
                 120, describe=lambda: "the private kube-apiserver to be ready\n"
                 + (logs / "kube-apiserver.log").read_text()[-3000:])
        bare.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        bare.wait_established("multiworkerjobs.multiworker.dev")
        yield bare
    finally:
        for proc in reversed(processes):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# gang_scheduler: the PodGroup CRD this test installs is built with the coscheduler (in CI, in
# the background while the first tests run); the gang tests run last of their chain.
@pytest.mark.usefixtures("gang_scheduler")
def test_gang_job_without_the_pod_group_crd_says_so_and_recovers_once_installed(
    bare_api_server: Cluster, tmp_path: Path
) -> None:
    bare = bare_api_server
    assert bare.kubectl("get", "--raw", f"/apis/{PG_GROUP}", check=False).returncode != 0
    namespace = "gang-missing"
    bare.kubectl("create", "namespace", namespace)
    bare.kubectl("-n", namespace, "create", "serviceaccount", "default")  # no controllers here
    process = OperatorProcess(env=bare.env, namespace=namespace,
                              log_path=tmp_path / "operator.log")
    process.start()
    jobs = Jobs(bare, namespace)
    try:
        jobs.apply(gpu_job("g", gang=True, script="exec sleep 3600"))

        def unavailable(status: dict[str, Any]) -> dict[str, Any] | None:
            running = condition(status, "Running")
            return status if running and running["reason"] == "GangSchedulingUnavailable" \
                else None

        status = jobs.wait("g", "a condition saying the PodGroup CRD is missing", unavailable)
        message = condition(status, "Running")["message"]
        assert PG_CRD in message and "spec.gang.enabled: false" in message, message
        wait_for(lambda: [e for e in jobs.events("g") if e[0] == "Warning"
                          and e[1] == "GangSchedulingUnavailable"], 30,
                 describe=lambda: f"a Warning Event; events: {jobs.events('g')}")
        assert jobs.pods("g") == [], "workers were created without their PodGroup"
        assert process.healthy(), "the operator stopped"

        # Installing the CRD later is enough: the job goes on without an operator restart.
        bare.kubectl("apply", "--server-side", "-f", str(BIN / "scheduling.x-k8s.io_podgroups.yaml"))
        bare.wait_established(PG_CRD)
        wait_for(lambda: pod_group(jobs, "g-g0"), 120,
                 describe=lambda: f"the PodGroup once the CRD exists\n{jobs.describe('g')}")

        def three_workers() -> list[dict[str, Any]] | None:
            pods = jobs.pods("g")
            return pods if len(pods) == 3 else None

        pods = wait_for(three_workers, 60, describe=lambda: f"three workers\n{jobs.describe('g')}")
        assert all(p["spec"]["schedulerName"] == SCHEDULER for p in pods)
        assert process.healthy(), "the operator stopped"
    except BaseException:
        print(f"---- operator log (tail) ----\n{process.log_tail(200)}")
        raise
    finally:
        process.stop()
