"""What only a cluster with several nodes can show, with real TensorFlow worker pods: a group
spread over two nodes training through the pod network, the loss of a node mid-training, and a
worker port blocked between nodes. Deselected on the single-node local cluster; run with
CLUSTER=kind (hack/kind/up.sh: two worker nodes, one checkpoint directory shared by both)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.e2e.test_recovery import tf_job, wait_checkpointed
from tests.integration.jobs import Jobs, condition, generation_of
from tests.support import wait_for

pytestmark = [pytest.mark.multinode, pytest.mark.usefixtures("worker_image", "operator")]

HOSTNAME = "kubernetes.io/hostname"


def spread_job(name: str, workers: int, **kwargs: Any) -> dict[str, Any]:
    """`tf_job` with its workers spread evenly over the schedulable nodes.

    Only pods of the same group count (matchLabelKeys on the generation label), and nodes the
    pods cannot go to (a lost node's NoSchedule taint, the control plane's) are not counted as
    empty places (nodeTaintsPolicy: Honor), so a restarted group may all land on one node.
    """
    manifest = tf_job(name, workers=workers, **kwargs)
    manifest["spec"]["template"]["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"multiworker.dev/job-name": name}},
        "matchLabelKeys": ["multiworker.dev/group-generation"],
        "nodeTaintsPolicy": "Honor",
    }]
    return manifest


def placement(jobs: Jobs, name: str, generation: int) -> dict[int, str]:
    """Worker index -> node name, for the running pods of one group generation."""
    return {int(p["metadata"]["labels"]["multiworker.dev/worker-index"]): p["spec"]["nodeName"]
            for p in jobs.pods(name)
            if generation_of(p) == generation and p["spec"].get("nodeName")}


def scheduled(jobs: Jobs, name: str, generation: int, workers: int) -> dict[int, str] | None:
    """The placement once every worker of the generation has a node, else None."""
    found = placement(jobs, name, generation)
    return found if len(found) == workers else None


def wait_node_ready(cluster: Cluster, node: str, timeout: float = 240) -> None:
    def ready() -> bool:
        out = cluster.kubectl("get", "node", node, "-o",
                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                              check=False).stdout
        return out == "True"
    wait_for(ready, timeout, describe=f"node {node} Ready again")


def test_four_workers_on_two_nodes_train_through_the_pod_network(
    jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str]
) -> None:
    jobs.apply(spread_job("spread", 4, env={"TRAIN_EPOCHS": "3"}))
    jobs.wait_running("spread", generation=0, timeout=300)
    nodes = placement(jobs, "spread", 0)
    assert sorted(nodes) == [0, 1, 2, 3], nodes
    per_node = {n: sum(1 for v in nodes.values() if v == n) for n in set(nodes.values())}
    assert len(per_node) == 2 and set(per_node.values()) == {2}, f"not spread: {nodes}"
    status = jobs.wait_phase("spread", "Succeeded", timeout=600)
    assert status["restarts"] == 0 and status["disruptions"] == 0, status
    assert (status.get("progress") or {}).get("step", 0) > 0, status


@pytest.fixture
def paused_nodes(cluster: Cluster) -> Iterator[list[str]]:
    """Node containers a test pauses; resumed (and Ready again) afterwards, pass or fail."""
    paused: list[str] = []
    yield paused
    for node in paused:
        cluster.docker("unpause", node, check=False)
    for node in paused:
        wait_node_ready(cluster, node)


@pytest.mark.timeout(1800)
def test_lost_node_restarts_the_group_on_the_remaining_node_as_a_disruption(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str],
    paused_nodes: list[str], record_property: Any,
) -> None:
    """`docker pause` freezes a worker node whole (kubelet, containers, their sockets): to the
    cluster it is a node that stopped answering. The collective timeout (also TensorFlow's
    heartbeat timeout) is set far above the expected detection time, so it is the operator's
    handling of the lost node, not the workers' own abort, that restarts the group. The node
    without the chief is the one lost, so no old chief can write checkpoints meanwhile."""
    name = "nodeloss"
    jobs.apply(spread_job(name, 4, env={"TRAIN_EPOCHS": "12"},
                          health={"collectiveTimeoutSeconds": 1200}))
    jobs.wait_running(name, generation=0, timeout=300)
    wait_checkpointed(jobs, name)
    before = jobs.status(name)
    nodes = placement(jobs, name, 0)
    victim = next(n for n in set(nodes.values()) if n != nodes[0])
    survivor = nodes[0]
    lost_workers = sorted(i for i, n in nodes.items() if n == victim)

    cluster.docker("pause", victim)
    paused_nodes.append(victim)
    stopped = time.monotonic()
    status = jobs.wait_running(name, generation=1, timeout=600)
    seconds = time.monotonic() - stopped
    record_property("figure: node stop -> new group Running (s)", round(seconds, 1))
    print(f"\nnode {victim} frozen -> new group Running in {seconds:.1f}s: "
          f"{status['lastFailure']['message']}")

    assert status["disruptions"] == before["disruptions"] + 1, status
    assert status["restarts"] == before["restarts"], status
    failure = status["lastFailure"]
    assert failure["worker"] in lost_workers and failure["action"] == "RestartGroupWithoutCounting", failure
    # Found by its silent Lease (renewed every 10 s), not by NotReady 50 s later.
    assert f"node {victim} last renewed its Lease at" in failure["message"], failure
    assert set(placement(jobs, name, 1).values()) == {survivor}
    # The node comes back while the new group trains: nothing on it may read as lost now.
    cluster.docker("unpause", victim)
    paused_nodes.remove(victim)
    wait_node_ready(cluster, victim)
    final = jobs.wait_phase(name, "Succeeded", timeout=600)
    assert final["restarts"] == 0 and final["disruptions"] == 1, final
    assert (final.get("progress") or {}).get("resumedFromStep", 0) > 0, final


@pytest.fixture
def node_local_claim(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A claim bound to a hostPath volume on each node's own disk (not the folder every kind
    node mounts): what kind's `standard` class or a ReadWriteOnce volume gives a group spread
    over nodes. Each node sees only what its own workers wrote."""
    name = f"mwj-local-{namespace}"[:63]
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "claimRef": {"namespace": namespace, "name": "node-local"},
                       "hostPath": {"path": f"/var/local/{name}", "type": "DirectoryOrCreate"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "node-local"},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                      "resources": {"requests": {"storage": "1Gi"}}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    yield "node-local"
    cluster.kubectl("delete", "pv", name, "--wait=false", check=False)


def test_a_checkpoint_volume_local_to_each_node_is_named_at_start_and_spends_no_restart(
    jobs: Jobs, node_local_claim: str, worker_nodes: list[str], record_property: Any,
) -> None:
    """Two workers on two nodes, each seeing its own node's directory: the workers' start-up
    markers do not cross, so the group stops at once with exit 2 naming the volume (the
    example's onExitCodes fail the job on 2) — no training, no restart spent."""
    name = "unshared"
    manifest = spread_job(name, 2, restartPolicy={
        "backoffSeconds": 1, "onExitCodes": [{"action": "FailJob", "values": [2]}]})
    manifest["spec"]["checkpoint"] = {"claimName": node_local_claim}
    jobs.apply(manifest)
    jobs.wait_running(name, generation=0, timeout=300)
    running = time.monotonic()
    status = jobs.wait_phase(name, "Failed", timeout=300)
    seconds = time.monotonic() - running
    record_property("figure: group Running -> Failed naming the volume (s)", round(seconds, 1))
    print(f"\nunshared volume: Running -> Failed in {seconds:.1f}s: "
          f"{status['lastFailure']['message']}")
    assert len(set(placement(jobs, name, 0).values())) == 2
    failure = status["lastFailure"]
    assert failure["exitCode"] == 2, failure
    assert "is not shared by all workers" in failure["message"], failure
    assert any(node in failure["message"] for node in worker_nodes), failure
    assert status["restarts"] == 0 and status["disruptions"] == 0, status


@pytest.fixture
def blocked_port(cluster: Cluster, worker_nodes: list[str]) -> Iterator[tuple[str, int]]:
    """A test-only partition: inside one node, DROP TCP to the port crossing its eth0 in
    either direction. Pods on different nodes cannot reach each other on it; everything else
    (DNS, the API, progress polls) and traffic within a node still flow."""
    node, port = worker_nodes[0], 2345
    rules = [["FORWARD", "-i", "eth0", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
             ["FORWARD", "-o", "eth0", "-p", "tcp", "--dport", str(port), "-j", "DROP"]]
    added = []
    try:
        for rule in rules:
            cluster.docker("exec", node, "iptables", "-I", *rule)
            added.append(rule)
        yield node, port
    finally:
        for rule in added:
            cluster.docker("exec", node, "iptables", "-D", *rule, check=False)


def test_port_blocked_between_nodes_fails_naming_the_unreachable_peer(
    jobs: Jobs, blocked_port: tuple[str, int]
) -> None:
    _, port = blocked_port
    name = "blocked"
    manifest = spread_job(name, 2, port=port, health={"peerTimeoutSeconds": 20},
                          restartPolicy={"maxRestarts": 0, "backoffSeconds": 1})
    del manifest["spec"]["checkpoint"]  # the group never forms: nothing to checkpoint
    jobs.apply(manifest)
    nodes = wait_for(lambda: scheduled(jobs, name, 0, 2), 120,
                     describe=lambda: f"both workers scheduled\n{jobs.describe(name)}")
    assert len(set(nodes.values())) == 2, f"the two workers share a node: {nodes}"
    status = jobs.wait_phase(name, "Failed", timeout=300)
    failure = status["lastFailure"]
    assert failure["exitCode"] == 3, failure
    peer = f"{name}-worker-{1 - failure['worker']}.{name}.{jobs.namespace}.svc:{port}"
    assert peer in failure["message"], failure
    failed = condition(status, "Failed")
    assert failed and peer in failed["message"], failed
    assert any(peer in message for _, _, message in jobs.events(name)), jobs.events(name)
