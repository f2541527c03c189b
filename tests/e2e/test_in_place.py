"""A group restarted in its own pods (spec.restartPolicy.mode InPlace, opt-in) and
recreated (Recreate), with real TensorFlow pods: the same pod uids, a new generation the trainer
sees, training resumed from the checkpoint, and the path taken in the status and the Event."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from multiworker.decide.inplace import STOP_BOUND

from tests.e2e.test_recovery import (
    WORKER_IMAGE,
    assert_resumed_and_succeeded,
    signal_worker,
    tf_job,
    wait_checkpointed,
)
from tests.integration.jobs import Jobs
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("worker_image", "operator")

# A training script that knows nothing of multiworker: TF_CONFIG for the strategy, a custom loop
# (Keras 3's fit cannot run MultiWorkerMirroredStrategy across workers, keras-team/keras#20585)
# and a CheckpointManager on the shared claim to resume, the way TensorFlow's guide does it:
# the chief saves to the shared directory, the others to their own.
PLAIN_SCRIPT = """
import json, os, sys, time
import tensorflow as tf
print("argv", json.dumps(sys.argv[1:]), flush=True)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
root = os.path.join(os.environ["BACKUP_ROOT"], "plain")
mine = root if task == 0 else f"/tmp/plain-worker-{task}"
with strategy.scope():
    w = tf.Variable(tf.zeros((4, 1)))
    step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(w=w, step=step)
manager = tf.train.CheckpointManager(checkpoint, mine, max_to_keep=2)
if tf.train.latest_checkpoint(root):
    checkpoint.restore(tf.train.latest_checkpoint(root))
print(f"start at step {int(step.numpy())}", flush=True)
@tf.function
def train_step():
    def replica():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(tf.ones((8, 4)), w) - 1.0) ** 2)
        return tape.gradient(loss, w)
    grad = strategy.reduce("MEAN", strategy.run(replica), axis=None)
    w.assign_sub(0.01 * grad)
    step.assign_add(1)
while int(step.numpy()) < 160:
    train_step()
    if int(step.numpy()) % 20 == 0:
        manager.save()
        print(f"step {int(step.numpy())}", flush=True)
    time.sleep(0.1)
print("done", flush=True)
"""


def uids(jobs: Jobs, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods(name)}


def restart_events(jobs: Jobs, name: str) -> list[str]:
    return [m for _, _, m in jobs.events(name) if m.startswith("restarting group")]


IN_PLACE = {"backoffSeconds": 1, "mode": "InPlace"}


def wait_logged(jobs: Jobs, pod: str, pattern: str, timeout: float = 120) -> None:
    """Wait for a trainer's log line while its group runs: once the chief exits 0,
    cleanPodPolicy Running deletes a worker pod that has not ended yet, logs and all."""
    def log() -> str:
        return str(jobs.kubectl("logs", pod, "-c", "tensorflow", check=False).stdout)
    wait_for(lambda: re.search(pattern, log()), timeout,
             describe=lambda: f"{pattern!r} in the log of {pod}: ...{log()[-3000:]}")


def assert_same_pods(jobs: Jobs, name: str, before: dict[str, str], status: dict[str, Any],
                     record: Any) -> None:
    """In place: the same pods, never the stop bound's fallback. (Before the operator told
    the agents directly, a kubelet slow to refresh their downwardAPI volume sent about one
    restart in a dozen there.)"""
    abandoned = [m for _, reason, m in jobs.events(name) if reason == "InPlaceRestartAbandoned"]
    record("figure: in-place path", "abandoned at the stop bound" if abandoned else "in place")
    assert not abandoned, abandoned
    assert status["restartPath"] == "InPlace", status
    # The same pods, those left: once the chief exits 0, cleanPodPolicy Running deletes a worker
    # pod that has not ended yet. A recreated pod, the chief's included, has a new uid.
    now = uids(jobs, name)
    assert now and all(before.get(pod) == uid for pod, uid in now.items()), (before, now)
    assert restart_events(jobs, name)[-1].endswith("restarting the group in place")


def test_a_killed_trainer_restarts_the_group_in_its_own_pods(
    jobs: Jobs, checkpoint_claim: str, record_property: Any
) -> None:
    jobs.apply(tf_job("inplace", restartPolicy=IN_PLACE))
    wait_checkpointed(jobs, "inplace")
    before = uids(jobs, "inplace")
    for pod in before:
        wait_spare_ready(jobs, pod)
    signal_worker(jobs, "inplace", 1, "SIGKILL")
    # The new generation's trainers run in the same pods and see their generation.
    running = jobs.wait("inplace", "the next generation running", lambda s: s if s.get(
        "groupGeneration", 0) >= 1 and s.get("phase") == "Running" else None, timeout=120)
    seen = jobs.kubectl("exec", "inplace-worker-0", "-c", "tensorflow", "--", "python3", "-c",
                        "import json, urllib.request as u; print(json.load(u.urlopen("
                        "'http://127.0.0.1:8471/progress', timeout=5))['generation'])",
                        ).stdout.strip()
    assert seen == str(running["groupGeneration"])
    # The operator told each agent (its labels may reach it later: the kubelet's schedule).
    told = jobs.kubectl("exec", "inplace-worker-0", "-c", "mwj-agent", "--", "sh", "-c",
                        "cd /run/multiworker && echo $(cat told-generation) "
                        "$(cat told-released)").stdout.split()
    assert told == [str(running["groupGeneration"])] * 2, told
    # The notes were signed; the trainer (the user's code) has no key, and its unsigned note
    # for the next generation is refused.
    forged = json.dumps({"uid": before["inplace-worker-0"],
                         "generation": running["groupGeneration"] + 1})
    answer = jobs.kubectl(
        "exec", "inplace-worker-0", "-c", "tensorflow", "--", "python3", "-c",
        "import os, sys, urllib.request as u, urllib.error as e\n"
        "print(os.path.exists('/etc/multiworker-key'))\n"
        "r = u.Request('http://127.0.0.1:8472/generation', method='PUT', "
        "data=sys.argv[1].encode())\n"
        "try: print(u.urlopen(r, timeout=5).status)\n"
        "except e.HTTPError as x: print(x.code, x.read().decode())", forged).stdout
    assert answer.split()[:2] == ["False", "401"], answer
    for pod in before:  # every trainer of generation 1 runs in its pod's spare
        wait_logged(jobs, pod, r"==== multiworker: generation 1 of worker \d, warm start")
    status = assert_resumed_and_succeeded(jobs, "inplace")
    assert (status["restarts"], status["disruptions"]) == (1, 0), status
    assert (status["lastFailure"]["worker"], status["lastFailure"]["exitCode"]) == (1, 137)
    assert_same_pods(jobs, "inplace", before, status, record_property)
    assert status["groupGeneration"] == 1


def test_a_launcher_that_dies_leaves_the_restart_to_the_kubelet(
    jobs: Jobs, checkpoint_claim: str, record_property: Any
) -> None:
    """The warm launcher of worker-1 is killed (as by the OOM killer): its container ends, the
    pod's restart rule restarts all of its containers, and that trainer starts cold; the
    group restarts in place as ever, the other worker from its spare."""
    jobs.apply(tf_job("orphaned", restartPolicy=IN_PLACE))
    wait_checkpointed(jobs, "orphaned")
    before = uids(jobs, "orphaned")
    for pod in before:
        wait_spare_ready(jobs, pod)
    pid = launcher_report(jobs, "orphaned-worker-1")["pid"]
    # Unchecked: the container ends with its launcher, which may end the exec session with
    # an error before `kill` reports back. The cold start of generation 1 below proves the kill.
    jobs.kubectl("exec", "orphaned-worker-1", "-c", "tensorflow", "--", "kill", "-KILL",
                 str(pid), check=False)
    wait_logged(jobs, "orphaned-worker-0", r"generation 1 of worker 0, warm start")
    wait_logged(jobs, "orphaned-worker-1",
                r"generation 1 of worker 1, cold start \(the container's first trainer\)")
    status = assert_resumed_and_succeeded(jobs, "orphaned")
    assert (status["restarts"], status["lastFailure"]["worker"]) == (1, 1), status
    assert_same_pods(jobs, "orphaned", before, status, record_property)


def test_recreate_mode_replaces_the_pods(jobs: Jobs, checkpoint_claim: str) -> None:
    jobs.apply(tf_job("recreate"))  # the default mode
    wait_checkpointed(jobs, "recreate")
    before = uids(jobs, "recreate")
    signal_worker(jobs, "recreate", 1, "SIGKILL")
    status = assert_resumed_and_succeeded(jobs, "recreate")
    assert (status["restarts"], status["restartPath"]) == (1, "Recreate"), status
    assert not set(uids(jobs, "recreate").values()) & set(before.values())


def test_a_plain_tf_config_script_resumes_in_place(
    jobs: Jobs, checkpoint_claim: str, record_property: Any
) -> None:
    manifest: dict[str, Any] = tf_job("plain", restartPolicy=IN_PLACE)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == WORKER_IMAGE
    # Values the kubelet expands into the line, with the quotes and backslashes a JSON text
    # of the line could not hold: the launcher runs what the kubelet would have.
    container["args"] = ["python3", "-c", PLAIN_SCRIPT, "$(CFG)", "C:\\temp\\new"]
    container["env"] = [{"name": "BACKUP_ROOT", "value": "$(MWJ_CHECKPOINT_DIR)"},
                        {"name": "CFG", "value": '{"lr": 0.1}'},
                        {"name": "MWJ_LAUNCHER_SPARE_DELAY", "value": "1"}]
    jobs.apply(manifest)
    jobs.wait("plain", "step 40 saved", lambda s: s if "step 40" in jobs.kubectl(
        "logs", "plain-worker-0", "-c", "tensorflow", check=False).stdout else None,
        timeout=240)
    before = uids(jobs, "plain")
    wait_spare_ready(jobs, "plain-worker-0")
    kill_trainer(jobs, "plain-worker-0")
    status = jobs.wait_phase("plain", "Succeeded", timeout=300)
    assert status["restarts"] == 1, status
    assert_same_pods(jobs, "plain", before, status, record_property)
    log = jobs.kubectl("logs", "plain-worker-0", "-c", "tensorflow").stdout
    assert re.findall(r"^argv (.*)$", log, re.MULTILINE) == [
        json.dumps(['{"lr": 0.1}', "C:\\temp\\new"])] * 2, log
    starts = re.findall(r"start at step (\d+)", log)  # each generation's, in order
    assert len(starts) == 2 and int(starts[-1]) >= 40 and "done" in log, log
    # Every generation's output in order, under its header; the second from the spare.
    headers = re.findall(r"==== multiworker: generation (\d+) of worker 0, (\w+) start", log)
    assert headers == [("0", "cold"), ("1", "warm")], log


LAUNCHER_REPORT = "/run/multiworker/launcher.json"


def launcher_report(jobs: Jobs, pod: str) -> dict[str, Any]:
    """The warm launcher's report in `pod` (pod/launcher.py), {} before it writes one."""
    found = jobs.kubectl("exec", pod, "-c", "tensorflow", "--", "cat", LAUNCHER_REPORT,
                         check=False).stdout
    return dict(json.loads(found)) if found.strip() else {}


def wait_spare_ready(jobs: Jobs, pod: str) -> None:
    wait_for(lambda: launcher_report(jobs, pod).get("spare") == "ready", 120,
             describe=f"the spare of {pod}'s launcher ready")


def kill_trainer(jobs: Jobs, pod: str) -> None:
    """SIGKILL the trainer the launcher runs (not its spare, whose command line is the same)."""
    pid = launcher_report(jobs, pod)["trainerPid"]
    jobs.kubectl("exec", pod, "-c", "tensorflow", "--", "kill", "-KILL", str(pid))


def freeze_agent(pod: str) -> int:
    """SIGSTOP the in-place agent of `pod` from this machine (the local cluster's and kind's
    containers share its kernel): the agent of a frozen node, which never restarts its pod."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent.py\0watch" in cmdline and f"HOSTNAME={pod}".encode() in environ:
            os.kill(int(pid), signal.SIGSTOP)
            return int(pid)
    raise AssertionError(f"no agent process of {pod} on this machine")


def test_an_old_trainer_that_never_stops_makes_the_group_recreated(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    """worker-1 hangs (SIGSTOP) and so does its agent: its old trainer never stops, so the
    in-place restart is abandoned after inplace.STOP_BOUND and the group recreated, counting one restart."""
    jobs.apply(tf_job("stuck", restartPolicy=IN_PLACE,
                      health={"progressTimeoutSeconds": 20, "collectiveTimeoutSeconds": 600}))
    wait_checkpointed(jobs, "stuck")
    before = uids(jobs, "stuck")
    freeze_agent("stuck-worker-1")
    signal_worker(jobs, "stuck", 1, "SIGSTOP")
    status = assert_resumed_and_succeeded(jobs, "stuck")
    assert (status["restarts"], status["groupGeneration"], status["restartPath"]) == \
        (1, 2, "Recreate"), status
    abandoned = [m for _, reason, m in jobs.events("stuck") if reason == "InPlaceRestartAbandoned"]
    assert abandoned and (f"worker-1 had not stopped {STOP_BOUND.total_seconds():g}s after the "
                          "restart began") in abandoned[0], abandoned
    assert not set(uids(jobs, "stuck").values()) & set(before.values())
