"""What only a cluster with several nodes can show, with real TensorFlow worker pods: a group
spread over two nodes training through the pod network; a node frozen, stopped with the
operator's leader on it, or cut off from the control plane mid-training, and its return; an
unshared checkpoint volume; a worker port blocked between nodes. Deselected on the single-node
local cluster; run with CLUSTER=kind (hack/kind/up.sh: two worker nodes, one checkpoint
directory shared by both)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.e2e.test_elastic import events_of, sized_start, trained_samples
from tests.e2e.test_gang import GPU
from tests.e2e.test_recovery import tf_job, wait_checkpointed
from tests.integration.helm import Release
from tests.integration.jobs import Jobs, condition, generation_of
from tests.support import wait_for

# Most tests run the operator as a process beside the cluster (the `operator` fixture); those
# about the operator's own node install the chart into the cluster instead (`release`).
pytestmark = [pytest.mark.multinode, pytest.mark.usefixtures("worker_image")]

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


def checkpointed_spread_job(jobs: Jobs, name: str, epochs: int) -> dict[int, str]:
    """A 4-worker spread job running and checkpointed; its placement. The collective timeout
    (also TensorFlow's heartbeat timeout) is far above any detection time, so it is the
    operator's handling of a lost node, not the workers' own abort, that restarts the group."""
    jobs.apply(spread_job(name, 4, env={"TRAIN_EPOCHS": str(epochs)},
                          health={"collectiveTimeoutSeconds": 1200}))
    jobs.wait_running(name, generation=0, timeout=300)
    wait_checkpointed(jobs, name)
    return placement(jobs, name, 0)


def wait_node_ready(cluster: Cluster, node: str, timeout: float = 240) -> None:
    def ready() -> bool:
        out = cluster.kubectl("get", "node", node, "-o",
                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                              check=False).stdout
        return out == "True"
    wait_for(ready, timeout, describe=f"node {node} Ready again")


def wait_node_schedulable(cluster: Cluster, node: str, timeout: float = 120) -> None:
    wait_for(lambda: node in cluster.schedulable_workers(), timeout,
             describe=f"node {node} schedulable again (no NoSchedule taint, not cordoned)")


@pytest.mark.usefixtures("operator")
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


class Outages:
    """Node outages a test causes; each ended (and its node Ready again) afterwards, pass or
    fail."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._ends: dict[str, Callable[[], object]] = {}
        self._nodes: set[str] = set()  # every node an outage touched

    def freeze(self, node: str) -> None:
        """`docker pause`: kubelet, containers and their sockets stop dead (a hung node)."""
        self.cluster.docker("pause", node)
        self._ends[node] = lambda: self.cluster.docker("unpause", node, check=False)

    def stop(self, node: str) -> None:
        """`docker stop`: the node powers off; its containers die with it."""
        self.cluster.docker("stop", node)
        self._ends[node] = lambda: self.cluster.docker("start", node, check=False)

    def cut_off(self, node: str) -> None:
        """DROP everything between the node (its kubelet and its pods) and the control plane's
        addresses, both families: the node and its pods run on and still reach the other nodes,
        but neither the API server nor the control plane's controllers hear from it."""
        rules = []
        for tool, address in zip(("iptables", "ip6tables"), self._control_plane(), strict=True):
            if address:
                for chain in ("OUTPUT", "FORWARD"):
                    rules.append((tool, chain, "-d", address, "-j", "DROP"))
        for tool, *rule in rules:
            self.cluster.docker("exec", node, tool, "-I", *rule)

        def end() -> None:
            for tool, *rule in rules:
                self.cluster.docker("exec", node, tool, "-D", *rule, check=False)
        self._ends[node] = end

    def end(self, node: str) -> None:
        self._nodes.add(node)
        self._ends.pop(node)()

    def end_all(self) -> None:
        """Every outage ended, and each node back for the next test: Ready, and schedulable
        again (the node lifecycle controller lifts its NoSchedule taints seconds after Ready,
        more on a busy machine: in CI the next test found one worker node)."""
        for node in list(self._ends):
            self.end(node)
        for node in sorted(self._nodes):
            wait_node_ready(self.cluster, node)
            wait_node_schedulable(self.cluster, node)

    def _control_plane(self) -> tuple[str, str]:
        out = self.cluster.docker(
            "inspect", "multiworker-control-plane", "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.GlobalIPv6Address}}{{end}}",
        ).stdout.split()
        return out[0], out[1] if len(out) > 1 else ""


@pytest.fixture
def outages(cluster: Cluster) -> Iterator[Outages]:
    found = Outages(cluster)
    yield found
    found.end_all()


@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("operator")
def test_lost_node_restarts_the_group_on_the_remaining_node_as_a_disruption(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str],
    outages: Outages, record_property: Any,
) -> None:
    """`docker pause` freezes a worker node whole (kubelet, containers, their sockets): to the
    cluster it is a node that stopped answering. The node without the chief is the one lost, so no old chief can write checkpoints meanwhile. A
    5 s freeze first is a heartbeat gap, which restarts nothing."""
    name = "nodeloss"
    nodes = checkpointed_spread_job(jobs, name, epochs=14)
    before = jobs.status(name)
    victim = next(n for n in set(nodes.values()) if n != nodes[0])
    survivor = nodes[0]
    lost_workers = sorted(i for i, n in nodes.items() if n == victim)

    outages.freeze(victim)
    time.sleep(5)
    outages.end(victim)
    time.sleep(25)  # past nodeLostSeconds (20) from the last renewal before the gap
    gap = jobs.status(name)
    assert gap["groupGeneration"] == 0 and gap["disruptions"] == before["disruptions"], gap

    status = timed_outage(jobs, name, f"{victim} frozen", lambda: outages.freeze(victim),
                          record_property)

    assert status["disruptions"] == before["disruptions"] + 1, status
    assert status["restarts"] == before["restarts"], status
    failure = status["lastFailure"]
    assert failure["worker"] in lost_workers and failure["action"] == "RestartGroupWithoutCounting", failure
    # Found by its silent Lease (renewed every 10 s), not by NotReady 50 s later.
    assert f"node {victim} last renewed its Lease at" in failure["message"], failure
    assert set(placement(jobs, name, 1).values()) == {survivor}
    # The workers left on the other node waited in their collective for the frozen peers; the
    # operator's SIGTERM made them save a copy of the state, and the new group resumed there.
    progress = jobs.status(name).get("progress") or {}
    assert (progress.get("resumedFrom") or "").startswith("survivors of generation"), progress
    # The node comes back while the new group trains: nothing on it may read as lost now.
    outages.end(victim)
    wait_node_ready(cluster, victim)
    final = jobs.wait_phase(name, "Succeeded", timeout=600)
    assert final["restarts"] == 0 and final["disruptions"] == 1, final
    assert (final.get("progress") or {}).get("resumedFromStep", 0) > 0, final


def install_in_cluster(release: Release, tmp_path: Path) -> dict[str, str]:
    """The chart with its defaults (two replicas, apart), watching the test's namespace only;
    returns operator pod -> node."""
    release.install({"watchNamespaces": [release.namespace]}, tmp_path)
    release.wait_rolled_out()
    pods = json.loads(release.kubectl(
        "get", "pods", "-l", f"app.kubernetes.io/instance={release.name}", "-o", "json").stdout)
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods["items"]}


def first_new_step(jobs: Jobs, name: str, generation: int, timeout: float) -> dict[str, Any]:
    """The status once generation `generation` reported a training step past its restore."""
    def trained(s: dict[str, Any]) -> dict[str, Any] | None:
        progress = s.get("progress") or {}
        resumed = progress.get("resumedFromStep")
        return s if s.get("groupGeneration") == generation and resumed is not None \
            and (progress.get("step") or 0) > resumed else None
    result: dict[str, Any] = jobs.wait(name, f"generation {generation} training", trained,
                                       timeout)
    return result


def timed_outage(jobs: Jobs, name: str, what: str, outage: Callable[[], object],
                 record_property: Any) -> dict[str, Any]:
    """Causes `outage` (node `what`) and times it to generation 1 Running and to its first
    training step, as figures; returns the status once Running."""
    outage()
    began = time.monotonic()
    status: dict[str, Any] = jobs.wait_running(name, generation=1, timeout=600)
    running = time.monotonic() - began
    trained = first_new_step(jobs, name, 1, timeout=300)
    first_step = time.monotonic() - began
    kind = what.split(" ", 1)[1]
    record_property(f"figure: node {kind} -> new group Running (s)", round(running, 1))
    record_property(f"figure: node {kind} -> first new training step (s)", round(first_step, 1))
    print(f"\nnode {what} -> new group Running in {running:.1f}s, training in "
          f"{first_step:.1f}s (resumed from step {trained['progress']['resumedFromStep']}): "
          f"{status['lastFailure']['message']}")
    return status


@pytest.mark.timeout(1800)
def test_the_node_running_the_operator_and_workers_stops_and_returns(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str],
    outages: Outages, release: Release, tmp_path: Path, record_property: Any,
) -> None:
    """The chart's defaults (two replicas on different nodes, leader election): the node that
    runs the leading replica and half the workers is stopped. The standby takes the Lease, finds the node's Lease silent and starts a new group
    on the other node; the node is started again while it trains: Succeeded, no restart spent."""
    operators = install_in_cluster(release, tmp_path)
    assert len(set(operators.values())) == 2, f"both replicas on one node: {operators}"
    name = "opnode"
    nodes = checkpointed_spread_job(jobs, name, epochs=14)
    leader = wait_for(release.lease_holder, 60, interval=1, describe="a Lease holder")
    victim = operators[leader]
    assert victim in nodes.values(), f"no worker on the leader's node {victim}: {nodes}"

    status = timed_outage(jobs, name, f"{victim} (the leader's) stopped",
                          lambda: outages.stop(victim), record_property)
    new_leader = release.lease_holder()
    assert new_leader != leader and operators.get(new_leader or "") != victim, new_leader
    assert status["disruptions"] == 1 and status["restarts"] == 0, status
    assert f"node {victim} last renewed its Lease at" in status["lastFailure"]["message"], status

    outages.end(victim)
    wait_node_ready(cluster, victim)
    final = jobs.wait_phase(name, "Succeeded", timeout=600)
    assert final["restarts"] == 0 and final["disruptions"] == 1, final
    assert (final.get("progress") or {}).get("resumedFromStep", 0) > 0, final


def running_containers_of(cluster: Cluster, node: str, pod_uids: set[str]) -> list[str]:
    """The node runtime's running containers of the given pods, asked of the node itself (its
    kubelet may not reach the API server)."""
    out = cluster.docker("exec", node, "crictl", "ps", "-o", "json", check=False).stdout
    containers = json.loads(out or "{}").get("containers") or []
    return [f"{c['labels'].get('io.kubernetes.pod.name')}/{c['metadata']['name']}"
            for c in containers
            if c.get("labels", {}).get("io.kubernetes.pod.uid") in pod_uids]


def sandboxes_of(cluster: Cluster, node: str, pod_uids: set[str]) -> list[str]:
    """The node runtime's pod sandboxes (any state) of the given pods: its kubelet removes
    them once it has learned the pods are gone from the API."""
    out = cluster.docker("exec", node, "crictl", "pods", "-o", "json", check=False).stdout
    pods = json.loads(out or "{}").get("items") or []
    return [f"{p['metadata']['name']} {p['state']}" for p in pods
            if p["metadata"].get("uid") in pod_uids]


@pytest.mark.timeout(1800)
def test_a_node_cut_off_from_the_control_plane_is_replaced_and_its_workers_stop_on_return(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str],
    outages: Outages, release: Release, tmp_path: Path, record_property: Any,
) -> None:
    """A partition: the node without the leader loses the control plane but not its peers.
    Its Lease goes silent while its workers keep training and answering the operator's polls,
    which explains the silence away — until the node controller calls the node unreachable
    (~50 s): then nothing can stop or evict those pods, so the group restarts on the other
    node, the old pods are force-deleted in the API (the checkpoint fence keeps their
    trainers from saving; with their peers gone their collective breaks, and they stop on the
    node by themselves), and when the node reconnects its kubelet removes what is left of them."""
    operators = install_in_cluster(release, tmp_path)
    name = "partition"
    nodes = checkpointed_spread_job(jobs, name, epochs=40)
    leader = wait_for(release.lease_holder, 60, interval=1, describe="a Lease holder")
    victim = next(n for n in set(nodes.values()) if n != operators[leader])
    old = {p["metadata"]["uid"] for p in jobs.pods(name) if p["spec"].get("nodeName") == victim}
    assert old, f"no worker on {victim}: {nodes}"

    status = timed_outage(jobs, name, f"{victim} cut off", lambda: outages.cut_off(victim),
                          record_property)
    assert status["disruptions"] == 1 and status["restarts"] == 0, status
    # Its workers answered, so the node was lost by the control plane's word, not its Lease —
    # unless two polls in a row went unanswered first (2 s each: CI's two cores, shared by
    # both tiers, have done that once), when the silent Lease stands. Either names the node.
    failure = status["lastFailure"]
    record_property("lost_by", "Lease" if "last renewed its Lease" in failure["message"]
                    else "node status")
    assert failure["reason"] == "NodeLost" and (
        f"node {victim} is unreachable since" in failure["message"]
        or f"node {victim} last renewed its Lease" in failure["message"]), status
    assert victim not in placement(jobs, name, 1).values()
    # Gone from the API (force-deleted) while the node cannot hear it. With their peers gone
    # their collective breaks, so the old trainers stop on the node by themselves; whether its
    # kubelet has already collected their sandboxes depends on when its garbage collection ran.
    assert not {p["metadata"]["uid"] for p in jobs.pods(name)} & old
    wait_for(lambda: not running_containers_of(cluster, victim, old), 240, interval=2,
             describe=lambda: f"the old workers on {victim} to stop: "
                              f"{running_containers_of(cluster, victim, old)}")

    outages.end(victim)
    wait_node_ready(cluster, victim)
    wait_for(lambda: not sandboxes_of(cluster, victim, old), 120, interval=2,
             describe=lambda: f"the kubelet of {victim} to remove the old pods: "
                              f"{sandboxes_of(cluster, victim, old)}")
    final = jobs.wait_phase(name, "Succeeded", timeout=900)
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


@pytest.mark.usefixtures("operator")
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
    # Read while the group runs: a failed group's pods may be deleted by the time Failed is seen.
    nodes = placement(jobs, name, 0)
    status = jobs.wait_phase(name, "Failed", timeout=300)
    seconds = time.monotonic() - running
    record_property("figure: group Running -> Failed naming the volume (s)", round(seconds, 1))
    print(f"\nunshared volume: Running -> Failed in {seconds:.1f}s: "
          f"{status['lastFailure']['message']}")
    assert len(set(nodes.values())) == 2, f"the two workers share a node: {nodes}"
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


@pytest.mark.usefixtures("operator")
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


@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("operator")
def test_an_elastic_group_that_lost_a_node_trains_on_smaller_and_grows_back_on_its_return(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, worker_nodes: list[str],
    outages: Outages, record_property: Any,
) -> None:
    """An elastic group with no spare capacity: 4 workers of 2 GPUs fill both worker nodes' 4 GPUs. The
    node of the chief stops: the new group cannot be placed whole, so after
    shrinkAfterSeconds it trains with the 2 that fit, from the state the survivors saved;
    once the node is back and its room has lasted growAfterSeconds, the group grows back to 4
    at a checkpoint and succeeds. ScaleLearningRate's sample count runs on across both."""
    name = "elastic"
    manifest = tf_job(name, workers=4,
                      env={"TRAIN_EPOCHS": "40", "TRAIN_STEP_SLEEP": "0.2"},
                      elastic={"minWorkers": 2, "shrinkAfterSeconds": 20,
                               "growAfterSeconds": 20, "batch": "ScaleLearningRate"},
                      health={"collectiveTimeoutSeconds": 1200})
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {GPU: "2"}
    jobs.apply(manifest)
    jobs.wait_running(name, generation=0, timeout=300)
    wait_checkpointed(jobs, name)
    victim = placement(jobs, name, 0)[0]

    outages.stop(victim)
    stopped = time.monotonic()
    jobs.wait(name, "the group shrunk to 2",
              lambda s: s if s.get("groupWorkers") == 2 else None, timeout=300)
    sample, step = sized_start(jobs, name, 2)
    shrunk_in = time.monotonic() - stopped
    assert step > 0 and sample == step * 128, (sample, step)  # 4 x 32 a step, now 2 x 32
    assert set(placement(jobs, name, jobs.status(name)["groupGeneration"]).values()) \
        .isdisjoint({victim})
    assert "could not be placed" in events_of(jobs, name, "Shrunk")[0]

    outages.end(victim)
    wait_node_ready(cluster, victim)
    # What a device plugin does when its node's kubelet starts: (re-)advertise the GPUs.
    gpus = {GPU: "4"}
    cluster.kubectl("patch", "node", victim, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"capacity": gpus, "allocatable": gpus}}))
    returned = time.monotonic()
    jobs.wait(name, "the group grown back to 4",
              lambda s: s if s.get("resizes") == 2 else None, timeout=300)
    grown_sample, grown_step = sized_start(jobs, name, 4)
    grown_in = time.monotonic() - returned
    assert grown_sample == sample + (grown_step - step) * 64, (grown_sample, grown_step)
    status = jobs.wait_phase(name, "Succeeded", timeout=900)
    assert (status["totalWorkers"], status.get("restarts", 0), status.get("resizes")) \
        == (4, 0, 2), status
    last, samples = trained_samples(jobs, name)
    assert samples == grown_sample + (last - grown_step) * 128, (last, samples)
    record_property("figure: node stopped -> training with 2 of 4 (s)", round(shrunk_in, 1))
    record_property("figure: node Ready again -> training with 4 of 4 (s)", round(grown_in, 1))
    print(f"\nelastic: node {victim} stopped -> training with 2 of 4 in {shrunk_in:.1f}s; "
          f"Ready again -> 4 of 4 in {grown_in:.1f}s")
