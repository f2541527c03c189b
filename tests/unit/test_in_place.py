"""In-place group restarts (decide/inplace.py, the in-place steps of reconcile.py, the agent's
pod states in observe.py): the same pods, relabelled, held until every old trainer stopped,
released together; recreated, saying why, whenever that is not safe."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from multiworker.api import names
from multiworker.clients.agents import AgentNote, note_body
from multiworker.clients.shapes import slim_node, slim_pod
from multiworker.decide.inplace import (
    RESTART_FEATURE,
    STOP_BOUND,
    agent_blocker,
    in_place_blocker,
)
from multiworker.decide.nodes import NodeTrouble
from multiworker.decide.workers import WorkerPhase, WorkerState, classify
from multiworker.pod import notes
from multiworker.reconcile.render import owner_reference, pod_digest, render_worker_pod

from tests.unit.builders import JOB_UID, make_job, make_spec
from tests.unit.fake_cluster import FakeCluster
from tests.unit.test_reconcile import (
    GPU_TEMPLATE,
    PODS,
    conditions,
    gpu_node,
    make,
    step,
)

Manifest = dict[str, Any]
KUBELET = "v1.36.3"


def on_kubelet(cluster: FakeCluster, version: str = KUBELET) -> FakeCluster:
    for node in cluster.nodes.values():
        node["status"]["nodeInfo"] = {"kubeletVersion": version}
        node["status"]["declaredFeatures"] = [RESTART_FEATURE]
    return cluster


IN_PLACE = {"mode": "InPlace"}


def running(**spec: Any) -> FakeCluster:
    spec["restartPolicy"] = {**IN_PLACE, **spec.get("restartPolicy", {})}
    return start_in_place(on_kubelet(make(**spec)))


def start_in_place(cluster: FakeCluster) -> FakeCluster:
    """The job's group created and running, its agents up: an in-place restart can start."""
    step(cluster)
    cluster.run()
    for pod in cluster.pods.values():
        pod["status"]["initContainerStatuses"] = [
            {"name": names.AGENT_CONTAINER, "state": {"running": {}}},
            {"name": names.GATE_CONTAINER, "state": {"terminated": {"exitCode": 0}}}]
        pod["status"]["containerStatuses"][0] |= {"containerID": "containerd://old",
                                                  "restartCount": 0}
    step(cluster)
    assert cluster.status["phase"] == "Running"
    return cluster


def pod_of(cluster: FakeCluster, index: int) -> Manifest:
    return cluster.pods[names.worker_name(cluster.job_name, index)]


def held(cluster: FakeCluster, index: int, exit_code: int = 137,
         reason: str = "Error") -> None:
    """What the kubelet shows once it restarted all of the pod's containers: the gate runs
    (holding the rest), the trainer waits, its last run ended with `exit_code`."""
    status = pod_of(cluster, index)["status"]
    trainer = status["containerStatuses"][0]
    trainer["restartCount"] = trainer.get("restartCount", 0) + 1
    trainer["state"] = {"waiting": {"reason": "PodInitializing"}}
    trainer["lastState"] = {"terminated": {"exitCode": exit_code, "reason": reason,
                                           "finishedAt": "2026-01-01T12:00:00Z"}}
    status["initContainerStatuses"][1]["state"] = {"running": {}}


def trainer_started(cluster: FakeCluster, index: int) -> None:
    status = pod_of(cluster, index)["status"]
    status["initContainerStatuses"][1]["state"] = {"terminated": {"exitCode": 0}}
    status["containerStatuses"][0]["state"] = {"running": {}}
    status["containerStatuses"][0]["containerID"] = "containerd://new"


def annotation(cluster: FakeCluster, index: int, key: str) -> str:
    return str(pod_of(cluster, index)["metadata"]["annotations"].get(key))


def test_a_crash_restarts_the_same_pods_once_every_old_trainer_stopped() -> None:
    cluster = running(restartPolicy={"backoffSeconds": 0})
    uids = {n: p["metadata"]["uid"] for n, p in cluster.pods.items()}
    held(cluster, 1)  # worker-1 crashed: its kubelet restarted its containers at once
    step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status["restarts"], status["restartPath"]) == \
        (1, 1, "InPlace")
    assert cluster.events[-1][2].endswith("; restarting the group in place")
    moved = step(cluster)  # moves the pods to generation 1: their agents restart their containers
    assert cluster.generations() == dict.fromkeys(PODS, "1")
    # ... told at once as well (the labels reach them when the kubelet refreshes them).
    assert moved.agent_notes == tuple(AgentNote(f"10.88.0.{10 + i}", 8472, uids[name], 1)
                                      for i, name in enumerate(PODS))
    assert all(annotation(cluster, i, names.ANNOTATION_RELEASED) == "0" for i in range(3))
    held(cluster, 0)
    step(cluster)  # worker-2's old trainer still runs: nothing is released
    assert annotation(cluster, 0, names.ANNOTATION_RELEASED) == "0"
    assert cluster.status["phase"] == "Restarting"
    held(cluster, 2)
    released = step(cluster)
    assert [annotation(cluster, i, names.ANNOTATION_RELEASED) for i in range(3)] == ["1"] * 3
    assert [(n.uid, n.generation, n.released) for n in released.agent_notes] == [
        (uids[name], 1, 1) for name in PODS]
    # Each trainer's restart count as released: a higher one is this generation's end.
    assert annotation(cluster, 1, names.ANNOTATION_TRAINER_RESTARTS) == str(
        pod_of(cluster, 1)["status"]["containerStatuses"][0]["restartCount"])
    assert "inPlaceSince" not in cluster.status or cluster.status["inPlaceSince"] is None
    for i in range(3):
        trainer_started(cluster, i)
    # The chief's launcher, still holding generation 1, reports its last trainer's path: not
    # this generation's start, which it says once it runs the trainer (warm).
    annotations = pod_of(cluster, 0)["metadata"]["annotations"]
    annotations[names.ANNOTATION_LAUNCHER] = json.dumps(
        {"generation": 1, "state": "held", "path": "cold"})
    step(cluster)
    assert cluster.status["history"][-1].get("trainerStart") is None
    annotations[names.ANNOTATION_LAUNCHER] = json.dumps(
        {"generation": 1, "state": "running", "path": "warm"})
    step(cluster)
    assert cluster.status["phase"] == "Running"
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods.items()} == uids
    assert cluster.created_pods == PODS  # the first group's, and no more
    assert [(r["generation"], r["path"], r.get("trainerStart"), r.get("reason"))
            for r in cluster.status["history"]] == [
        (0, "Created", None, "Error"), (1, "InPlace", "warm", None)]


def test_a_release_whose_status_write_failed_is_finished_not_abandoned() -> None:
    """The pods are marked released (and their trainers start) before the status clears
    inPlaceSince: a failed write there (a 409, a timeout, the leader gone) left the next pass
    finding no pod held, and it recreated a group that was already training."""
    cluster = running(restartPolicy={"backoffSeconds": 0})
    uids = {n: p["metadata"]["uid"] for n, p in cluster.pods.items()}
    held(cluster, 1)
    step(cluster)
    step(cluster)
    for i in (0, 2):
        held(cluster, i)
    cluster.fail_status_writes = 1
    with pytest.raises(RuntimeError):
        step(cluster)  # released on every pod; the status write fails
    assert [annotation(cluster, i, names.ANNOTATION_RELEASED) for i in range(3)] == ["1"] * 3
    assert cluster.status["inPlaceSince"]
    for i in range(3):
        trainer_started(cluster, i)
    again = step(cluster, STOP_BOUND.total_seconds())  # past the barrier's bound, even
    assert [r for _, r, _ in cluster.events].count("InPlaceRestartAbandoned") == 0
    assert cluster.status.get("inPlaceSince") is None
    assert [(n.uid, n.released) for n in again.agent_notes] == [(uids[n], 1) for n in PODS]
    step(cluster)
    assert cluster.status["phase"] == "Running" and cluster.status["groupGeneration"] == 1
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods.items()} == uids


def test_a_trainer_exit_seen_before_its_kubelet_restarts_the_containers_is_in_place() -> None:
    """The pod's only container has exited, the phase is still Running: the trainer's rule
    restarts it, so the pod has not ended."""
    cluster = running()
    pod_of(cluster, 1)["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 137, "reason": "Error", "finishedAt": "2026-01-01T12:00:00Z"}}
    step(cluster)
    assert (cluster.status["restartPath"], cluster.status["lastFailure"]["exitCode"]) == \
        ("InPlace", 137)


def test_an_exit_seen_once_outlives_the_kubelet_s_own_record_of_the_restart() -> None:
    """The kubelet soon replaces a restarted trainer's exit with "RestartingAllContainers,
    137"; the exit as the operator first saw it is kept on the pod and still decides: here a
    peer's symptom (exit 4) waits for the failure that caused it, and an exit 42 fails the
    job by its rule."""
    cluster = running(restartPolicy={"onExitCodes": [{"action": "FailJob", "values": [42]}]})
    pod_of(cluster, 2)["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 4, "reason": "Error", "finishedAt": "2026-01-01T12:00:01Z"}}
    step(cluster)  # a symptom: waits
    record = json.loads(annotation(cluster, 2, names.ANNOTATION_TRAINER_EXIT))
    assert (record["generation"], record["exitCode"]) == (0, 4)
    held(cluster, 2, exit_code=137, reason="RestartingAllContainers")  # the kubelet's record
    assert classify(pod_of(cluster, 2), 2, "tensorflow").exit_code == 4
    held(cluster, 1, exit_code=42)
    step(cluster)
    status = cluster.status
    assert (status["phase"], status["lastFailure"]["worker"], status["lastFailure"]["exitCode"]) \
        == ("Failed", 1, 42)


def test_a_trainer_of_the_released_generation_that_fails_is_a_failure_of_that_generation(
) -> None:
    cluster = running(restartPolicy={"backoffSeconds": 0})
    held(cluster, 1)
    step(cluster)
    step(cluster)
    for i in range(3):
        held(cluster, i)
    step(cluster)  # released
    for i in range(3):
        trainer_started(cluster, i)
    step(cluster)
    held(cluster, 2, exit_code=7)  # generation 1's worker-2 fails; the gate holds its pod
    step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status["restarts"]) == (2, 2)
    assert (status["lastFailure"]["worker"], status["lastFailure"]["exitCode"],
            status["lastFailure"]["generation"]) == (2, 7, 1)


def test_the_backoff_holds_the_release() -> None:
    cluster = running(restartPolicy={"backoffSeconds": 10})
    held(cluster, 1)
    step(cluster)
    step(cluster)
    for i in (0, 2):
        held(cluster, i)
    step(cluster)
    assert annotation(cluster, 0, names.ANNOTATION_RELEASED) == "0"
    step(cluster, 9)
    assert annotation(cluster, 0, names.ANNOTATION_RELEASED) == "1"


def test_the_start_up_timeout_counts_from_the_release_not_the_backoff() -> None:
    """The barrier and the backoff before the release are the operator's wait: a backoff as
    long as startupTimeoutSeconds failed the job at its first restart, naming a worker that
    had not been let start. The trainers are timed from their release."""
    cluster = running(restartPolicy={"backoffSeconds": 60}, health={"startupTimeoutSeconds": 60})
    held(cluster, 1)
    step(cluster)
    step(cluster)
    for i in (0, 2):
        held(cluster, i)
    step(cluster, 30)
    assert annotation(cluster, 0, names.ANNOTATION_RELEASED) == "0"
    step(cluster, 31)  # past the backoff, 62 s after the relabel: released, not failed
    assert cluster.status["phase"] != "Failed", cluster.events
    assert annotation(cluster, 0, names.ANNOTATION_RELEASED) == "1"
    step(cluster, 58)  # the released trainers still starting 59 s later: within the timeout
    assert cluster.status["phase"] != "Failed", cluster.events
    step(cluster, 2)
    assert cluster.status["phase"] == "Failed"
    assert cluster.events[-1][1] == "StartupTimeout"


def test_an_old_trainer_that_does_not_stop_in_time_makes_the_group_recreated() -> None:
    cluster = running(restartPolicy={"backoffSeconds": 0})
    held(cluster, 1)
    step(cluster)
    step(cluster)
    held(cluster, 0)
    step(cluster, STOP_BOUND.total_seconds())
    status = cluster.status
    assert (status["groupGeneration"], status["restarts"], status["restartPath"]) == \
        (2, 1, "Recreate")
    reason, message = cluster.events[-1][1:]
    assert reason == "InPlaceRestartAbandoned"
    assert f"worker-2 had not stopped {STOP_BOUND.total_seconds():g}s after the restart began" \
        in message
    step(cluster)
    assert all("deletionTimestamp" in p["metadata"] for p in cluster.pods.values())


def test_a_pod_not_holding_yet_is_told_of_the_rise_again_every_few_seconds() -> None:
    """A note lost to a busy agent must not leave the pod to the kubelet's late downwardAPI
    refresh, past the stop bound: the pods not holding yet are told again, the others not."""
    cluster = running(restartPolicy={"backoffSeconds": 0})
    uids = {i: pod_of(cluster, i)["metadata"]["uid"] for i in range(3)}
    held(cluster, 1)
    step(cluster)
    assert len(step(cluster).agent_notes) == 3  # the relabel tells every pod
    held(cluster, 0)
    first = step(cluster)  # 2 s after the rise: too early to tell again
    assert first.agent_notes == () and first.requeue is not None and first.requeue <= 1
    again = step(cluster)  # 3 s
    assert [(n.uid, n.generation, n.released) for n in again.agent_notes] == [(uids[2], 1, None)]
    assert cluster.status["restartPath"] == "InPlace"


def test_a_pod_deleted_while_the_group_stops_makes_the_group_recreated() -> None:
    cluster = running(restartPolicy={"backoffSeconds": 0})
    held(cluster, 1)
    step(cluster)
    step(cluster)
    cluster.user_deletes(0)
    step(cluster)
    assert cluster.status["restartPath"] == "Recreate"
    assert "worker-0's pod was disrupted (Deleted)" in cluster.events[-1][2]


def test_a_node_without_the_kubelet_feature_recreates_saying_why() -> None:
    cluster = running(restartPolicy={"backoffSeconds": 0})
    on_kubelet(cluster, "v1.35.2")
    held(cluster, 1)
    step(cluster)
    assert cluster.status["restartPath"] == "Recreate"
    assert cluster.events[-1][2].endswith(
        "recreating the group's pods: the kubelet of node node-1 is v1.35.2, older than v1.36")
    step(cluster)
    assert all("deletionTimestamp" in p["metadata"] for p in cluster.pods.values())


# --- which path (decide/inplace.py) ---


def _worker(index: int = 0, **fields: Any) -> WorkerState:
    base: dict[str, Any] = {"phase": WorkerPhase.RUNNING, "pod": f"p{index}", "node": "n1",
                            "agent": True, "digest": "d"}
    return WorkerState(index, **(base | fields))


OPT_IN = {"restartPolicy": IN_PLACE}
TROUBLE = NodeTrouble("n1", "NotReady", None, "")


@pytest.mark.parametrize(("spec", "worker", "kw", "why"), [
    ({"restartPolicy": IN_PLACE}, _worker(), {}, None),
    ({"restartPolicy": IN_PLACE}, _worker(phase=WorkerPhase.FAILED, exit_code=1), {}, None),
    ({}, _worker(), {}, "spec.restartPolicy.mode is Recreate"),
    ({"restartPolicy": {"mode": "Recreate"}}, _worker(), {},
     "spec.restartPolicy.mode is Recreate"),
    (OPT_IN, _worker(), {"gang": True}, "gang scheduling places each generation as a new PodGroup"),
    (OPT_IN, WorkerState(0, WorkerPhase.MISSING), {}, "worker-0 has no pod"),
    (OPT_IN, _worker(terminating=True), {}, "worker-0's pod is being deleted"),
    (OPT_IN, _worker(phase=WorkerPhase.DISRUPTED, reason="Evicted"), {},
     "worker-0's pod was disrupted (Evicted)"),
    (OPT_IN, _worker(pod_ended=True, phase=WorkerPhase.FAILED), {}, "worker-0's pod is ended"),
    (OPT_IN, _worker(phase=WorkerPhase.PENDING, node=""), {}, "worker-0's pod is pending"),
    (OPT_IN, _worker(agent=False), {}, "worker-0's pod has no in-place agent"),
    (OPT_IN, _worker(digest="old"), {}, "worker-0's pod was created from an earlier template"),
    (OPT_IN, _worker(), {"troubles": {"n1": TROUBLE}}, "worker-0's node n1 is NotReady"),
    (OPT_IN, _worker(), {"kubelets": {"n1": "kwok-v0.7.0"}},
     "the kubelet of node n1 is kwok-v0.7.0, older than v1.36"),
])
def test_when_a_group_restarts_in_place(spec: Manifest, worker: WorkerState, kw: Manifest,
                                        why: str | None) -> None:
    args: dict[str, Any] = {"troubles": {}, "kubelets": {"n1": KUBELET}, "gang": False} | kw
    found = in_place_blocker(make_spec(**spec), (worker,), "d", **args)
    assert (found is None) if why is None else (found is not None and found.startswith(why))


# --- what a pod with the agent says (observe.py) ---


def _pod(generation: int, released: int, gate: str, trainer: Manifest,
         baseline: int = 0) -> Manifest:
    job = make_job()
    pod = render_worker_pod(job, 0, generation, owner_reference(job), agent=True)
    pod["metadata"] |= {"uid": "u", "creationTimestamp": "2026-01-01T11:00:00Z"}
    pod["metadata"]["annotations"] |= {names.ANNOTATION_RELEASED: str(released),
                                       names.ANNOTATION_TRAINER_RESTARTS: str(baseline)}
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {"phase": "Running", "hostIP": "10.0.0.1",
                     "conditions": [{"type": "PodScheduled", "status": "True"}],
                     "initContainerStatuses": [
                         {"name": names.AGENT_CONTAINER, "state": {"running": {}}},
                         {"name": names.GATE_CONTAINER, "state": {gate: {}}}],
                     "containerStatuses": [{"name": "tensorflow", **trainer}]}
    return pod


OLD_RUN = {"state": {"running": {}}, "restartCount": 0}
HELD = {"state": {"waiting": {"reason": "PodInitializing"}}, "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}}
REMOVED = {"state": {"waiting": {"reason": "RestartingAllContainers"}}, "restartCount": 1,
           "lastState": {"terminated": {"exitCode": 137, "reason": "RestartingAllContainers"}}}


@pytest.mark.parametrize(("pod", "phase", "reason", "exit_code"), [
    (_pod(1, 0, "terminated", OLD_RUN), WorkerPhase.STARTING, "StoppingOldTrainer", None),
    (_pod(1, 0, "running", HELD), WorkerPhase.STARTING, "WaitingForRelease", None),
    # Released: the gate opens in a moment; the trainer's count is the one released with.
    (_pod(1, 1, "running", HELD, baseline=1), WorkerPhase.STARTING, "PodInitializing", None),
    (_pod(1, 1, "terminated", {"state": {"running": {}}, "restartCount": 1}, baseline=1),
     WorkerPhase.RUNNING, "", None),
    # This generation's trainer ended; the kubelet restarted the containers, the gate holds.
    (_pod(1, 1, "running", {**HELD, "restartCount": 2}, baseline=1), WorkerPhase.FAILED,
     "Error", 3),
    (_pod(1, 1, "running", {**REMOVED, "restartCount": 2}, baseline=1), WorkerPhase.FAILED,
     "RestartedInPlace", None),
    # The first generation's trainer failed (nothing was released after creation).
    (_pod(0, 0, "running", HELD), WorkerPhase.FAILED, "Error", 3),
])
def test_a_pod_with_the_agent_is_judged_by_its_generation(
        pod: Manifest, phase: WorkerPhase, reason: str, exit_code: int | None) -> None:
    state = classify(pod, 0, "tensorflow")
    assert (state.phase, state.reason, state.exit_code) == (phase, reason, exit_code)
    assert classify(slim_pod(pod), 0, "tensorflow") == state  # as the operator's cache has it
    assert state.agent


def test_in_place_pods_carry_the_agent_and_the_trainer_s_rule() -> None:
    job = make_job(checkpoint={"claimName": "ckpt"})
    pod = render_worker_pod(job, 0, 4, owner_reference(job), agent=True)
    agent, gate = pod["spec"]["initContainers"][:2]
    assert (agent["name"], agent["restartPolicy"], agent["command"][-1]) == \
        ("mwj-agent", "Always", "watch")
    assert agent["restartPolicyRules"] == [{"action": "RestartAllContainers", "exitCodes": {
        "operator": "In", "values": [86]}}]
    assert (gate["name"], gate["command"][-1], "restartPolicy" in gate) == \
        ("mwj-gate", "gate", False)
    trainer = pod["spec"]["containers"][0]
    assert (trainer["restartPolicy"], trainer["restartPolicyRules"]) == ("Never", [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}])
    count = next(e for e in trainer["env"] if e["name"] == "MWJ_RESTART_COUNT")
    assert count["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['multiworker.dev/group-generation']"
    assert pod["metadata"]["annotations"][names.ANNOTATION_POD_DIGEST] == pod_digest(job, None)
    assert pod["spec"]["volumes"][-1]["name"] == "mwj-checkpoint"
    told = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in agent["env"]}
    assert told == {"MWJ_AGENT_PORT": "8472", "MWJ_AGENT_POD_UID": "metadata.uid",
                    "MWJ_AGENT_KEY_FILE": "/etc/multiworker-key/key"}


def test_the_jobs_key_is_mounted_into_the_agent_sidecar_alone() -> None:
    """The trainer runs the user's code (and the warm launcher runs it too): it must not be
    able to sign a note."""
    job = make_job(checkpoint={"claimName": "ckpt"}, restartPolicy={"mode": "InPlace"})
    pod = render_worker_pod(job, 0, 4, owner_reference(job), agent=True)
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    mounting = [c["name"] for c in containers
                if any(m["name"] == names.AGENT_KEY_VOLUME for m in c.get("volumeMounts", []))]
    assert mounting == [names.AGENT_CONTAINER]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == names.AGENT_KEY_VOLUME]
    assert volume["secret"] == {"secretName": names.agent_key_name(job.name, job.uid),
                                "optional": True, "defaultMode": 0o400,
                                "items": [{"key": "key", "path": "key"}]}


def secret_of(cluster: FakeCluster) -> Manifest:
    [secret] = [o for o in cluster.objects.values() if o["kind"] == "Secret"]
    return secret


def test_an_in_place_job_signs_every_note_with_its_own_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Secret is created before the pods, owned by the job (deleted with it); each pass
    that tells the agents reads it and signs (the operator keeps no copy: a new leader signs
    alike), and the agent's own check (pod/notes.py) accepts what it signed."""
    cluster = running(restartPolicy={"backoffSeconds": 0})
    secret = secret_of(cluster)
    assert secret["metadata"]["name"] == names.agent_key_name("demo", JOB_UID)
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [JOB_UID]
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) == 64  # 32 random bytes, as hex
    held(cluster, 1)
    step(cluster)
    moved = step(cluster)
    assert len(moved.agent_notes) == 3 and {n.key for n in moved.agent_notes} == {key}
    (tmp_path / "key").write_bytes(key)
    monkeypatch.setattr(notes, "KEY_FILE", str(tmp_path / "key"))
    for note in moved.agent_notes:
        assert notes.unsigned(note_body(note), time.time()) is None
    (tmp_path / "key").write_bytes(b"0" * 64)  # another job's key
    assert notes.unsigned(note_body(moved.agent_notes[0]), time.time()) is not None


def test_a_recreated_job_has_no_key_and_sends_no_notes() -> None:
    cluster = make()
    step(cluster)
    assert cluster.pods and not [o for o in cluster.objects.values() if o["kind"] == "Secret"]


def test_a_secret_of_the_keys_name_not_owned_by_the_job_blocks_it() -> None:
    """Never sign with (or mount) a key someone else made."""
    cluster = on_kubelet(make(restartPolicy=IN_PLACE))
    name = names.agent_key_name("demo", JOB_UID)
    cluster.objects[name] = {"kind": "Secret", "metadata": {"name": name, "ownerReferences": []},
                             "data": {"key": base64.b64encode(b"k" * 64).decode()}}
    step(cluster)
    assert cluster.pods == {}
    assert conditions(cluster)["Running"] == ("False", "ObjectConflict")
    assert f"Secret {name} exists and is not controlled by this job" in cluster.events[-1][2]


def test_the_node_cache_keeps_the_kubelet_version() -> None:
    node = {"metadata": {"name": "n1"}, "status": {"nodeInfo": {"kubeletVersion": KUBELET,
                                                                "osImage": "Debian"}}}
    assert slim_node(node)["status"]["nodeInfo"] == {"kubeletVersion": KUBELET}


def test_pods_without_the_agent_are_plain() -> None:
    job = make_job()
    pod = render_worker_pod(job, 0, 4, owner_reference(job))
    trainer = pod["spec"]["containers"][0]
    assert "initContainers" not in pod["spec"] and "restartPolicyRules" not in trainer
    assert {"name": "MWJ_RESTART_COUNT", "value": "4"} in trainer["env"]


def _node(name: str, features: bool = True, **spec: Any) -> Manifest:
    return {"metadata": {"name": name, "labels": {"pool": "a" if name < "n3" else "b"}},
            "spec": spec, "status": {"declaredFeatures": [RESTART_FEATURE] if features else []}}


def _gpu_node(name: str, gpus: int, features: bool = True) -> Manifest:
    node = _node(name, features)
    node["status"]["allocatable"] = {"nvidia.com/gpu": str(gpus)}
    return node


TAINT = {"key": "fake", "value": "x", "effect": "NoSchedule"}
GPU_POD = {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}


@pytest.mark.parametrize(("pod_spec", "nodes", "why"), [
    ({}, [_node("n1"), _node("n2")], None),
    ({}, [_node("n1"), _node("n2", features=False)], "nodes n2 do not declare"),
    ({}, [], "no schedulable node"),
    # Nodes the pods cannot land on do not count: another pool, a taint, a cordon.
    ({"nodeSelector": {"pool": "a"}}, [_node("n1"), _node("n3", features=False)], None),
    ({}, [_node("n1"), _node("n2", features=False, taints=[TAINT])], None),
    ({"tolerations": [{"key": "fake", "operator": "Exists"}]},
     [_node("n1"), _node("n2", features=False, taints=[TAINT])], "nodes n2 do not declare"),
    ({"tolerations": [{"key": "fake", "value": "y"}]},
     [_node("n1"), _node("n2", features=False, taints=[TAINT])], None),
    ({}, [_node("n1"), _node("n2", features=False, unschedulable=True)], None),
    # A pod that asks for GPUs lands only where there are enough: CPU nodes do not count.
    (GPU_POD, [_gpu_node("n1", 4), _node("n2", features=False)], None),
    (GPU_POD, [_gpu_node("n1", 4), _gpu_node("n2", 1, features=False)], None),
    (GPU_POD, [_gpu_node("n1", 4), _gpu_node("n2", 2, features=False)], "nodes n2 do not declare"),
    (GPU_POD, [_node("n1"), _node("n2")], "no schedulable node"),
])
def test_pods_get_the_agent_where_every_node_they_may_land_on_declares_the_feature(
        pod_spec: Manifest, nodes: list[Manifest], why: str | None) -> None:
    found = agent_blocker(pod_spec, nodes)
    assert (found is None) if why is None else (found is not None and found.startswith(why))


def test_a_group_on_nodes_without_the_feature_is_created_without_the_agent() -> None:
    """The scheduler places a pod with the rule only on nodes that declare the feature
    (kwok's fake nodes, older kubelets do not): such pods would never be scheduled."""
    cluster = make(restartPolicy=IN_PLACE)
    step(cluster)
    assert all("initContainers" not in p["spec"] for p in cluster.pods.values())
    cluster = on_kubelet(make(restartPolicy=IN_PLACE))
    step(cluster)
    assert all(p["spec"]["initContainers"][0]["name"] == "mwj-agent"
               for p in cluster.pods.values())


def test_a_gpu_group_gets_the_agent_when_only_nodes_it_cannot_use_lack_the_feature() -> None:
    """Asked about the pod as rendered: its GPU product's nodeSelector and its GPU request
    keep a CPU node, or another product's, without the feature from taking the agent away."""
    cluster = make(template=GPU_TEMPLATE, restartPolicy=IN_PLACE)
    cluster.nodes = {"a": gpu_node("a", "A100", 4), "b": gpu_node("b", "T4", 1),
                     "cpu": {"metadata": {"name": "cpu"}, "spec": {},
                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}
    cluster.nodes["a"]["status"]["declaredFeatures"] = [RESTART_FEATURE]
    step(cluster)
    assert cluster.status["gpuProduct"] == "A100"
    assert all(p["spec"]["initContainers"][0]["name"] == "mwj-agent"
               for p in cluster.pods.values())


def test_the_digest_changes_with_the_template_and_the_image() -> None:
    job = make_job()
    edited = make_job(template={"spec": {"containers": [{"name": "tensorflow",
                                                         "image": "other"}]}})
    assert pod_digest(job, None) != pod_digest(edited, None)
    assert pod_digest(job, None) != pod_digest(job, "sha256:abc")
    assert pod_digest(job, None) == pod_digest(make_job(), None)
