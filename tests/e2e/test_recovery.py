"""Every way a MultiWorkerMirroredStrategy group dies or stalls, with real TensorFlow pods:
each must end in the right outcome with the right counts — resumed from a checkpoint and
Succeeded, or Failed with the reason named."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.jobs import Jobs, condition
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("worker_image", "operator")

WORKER_IMAGE = "multiworker.local/worker:dev"
TRAIN = "/opt/multiworker/examples/training/train.py"
# Signal the training process (tini is PID 1; train.py is its child), never this script itself.
# The trainer's processes, not a warm launcher's spare (pod/launcher.py: the same command
# line, waiting to be the next generation's trainer).
SIGNAL_TRAINER = """
import json, os, signal, sys
me = os.getpid()
try:
    trainer = json.load(open("/run/multiworker/launcher.json")).get("trainerPid")
except (OSError, ValueError):
    trainer = None
if trainer:  # a warm launcher's: its spare runs the same command line, and may start meanwhile
    os.kill(trainer, getattr(signal, sys.argv[1]))
    print("signalled", trainer)
    sys.exit()
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if b"train.py" in cmd and b"SIGNAL_TRAINER" not in cmd:
        os.kill(int(pid), getattr(signal, sys.argv[1]))
        print("signalled", pid)
"""


def tf_job(name: str, workers: int = 2, env: dict[str, Any] | None = None,
           **spec: Any) -> dict[str, Any]:
    """A job running the example training script slowly enough to be interrupted mid-way."""
    train_env = {"TRAIN_EPOCHS": "8", "TRAIN_STEPS_PER_EPOCH": "20", "TRAIN_STEP_SLEEP": "0.1",
                 **(env or {})}
    container = {
        "name": "tensorflow", "image": WORKER_IMAGE, "imagePullPolicy": "IfNotPresent",
        # args, not command: the image's entrypoint (tini) stays PID 1, so train.py can be
        # signalled (the kernel ignores SIGKILL and SIGSTOP sent to a namespace's PID 1).
        "args": ["python3", TRAIN],
        "env": [{"name": k, "value": v} for k, v in train_env.items()],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    spec.setdefault("restartPolicy", {"backoffSeconds": 1})
    return {
        "apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {
            "workers": workers,
            "checkpoint": {"claimName": "checkpoints"},
            "template": {"spec": {"terminationGracePeriodSeconds": 15,
                                  "containers": [container]}},
            **spec,
        },
    }


def signal_worker(jobs: Jobs, name: str, index: int, signal: str) -> None:
    out = jobs.kubectl("exec", f"{name}-worker-{index}", "-c", "tensorflow", "--",
                       "python3", "-c", SIGNAL_TRAINER, signal).stdout
    assert "signalled" in out, f"no train.py process found in worker {index}"


def wait_checkpointed(jobs: Jobs, name: str, timeout: float = 180) -> dict[str, Any]:
    """Until the workers report a checkpoint, so a restart has something to resume from."""
    result: dict[str, Any] = jobs.wait(
        name, "a checkpoint reported in status.progress",
        lambda s: s if (s.get("progress") or {}).get("lastCheckpointStep") else None, timeout)
    return result


def assert_resumed_and_succeeded(jobs: Jobs, name: str) -> dict[str, Any]:
    status: dict[str, Any] = jobs.wait_phase(name, "Succeeded", timeout=300)
    assert status["groupGeneration"] >= 1
    assert (status.get("progress") or {}).get("resumedFromStep", 0) > 0, status
    return status


def test_killed_worker_restarts_the_group_from_its_checkpoint(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    jobs.apply(tf_job("kill9"))
    wait_checkpointed(jobs, "kill9")
    signal_worker(jobs, "kill9", 1, "SIGKILL")
    status = assert_resumed_and_succeeded(jobs, "kill9")
    assert status["restarts"] == 1 and status["disruptions"] == 0
    failure = status["lastFailure"]
    assert failure["worker"] == 1 and failure["exitCode"] == 137, failure
    assert status["lastRecoverySeconds"] > 0


def test_deleted_pod_is_a_disruption_that_spends_no_budget(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    jobs.apply(tf_job("deleted", restartPolicy={"backoffSeconds": 1, "mode": "InPlace"}))
    wait_checkpointed(jobs, "deleted")
    jobs.kubectl("delete", "pod", "deleted-worker-0", "--wait=false")
    status = assert_resumed_and_succeeded(jobs, "deleted")
    assert status["restarts"] == 0 and status["disruptions"] == 1, status
    # A pod that is gone cannot restart in place: the group is recreated, saying why.
    assert status["restartPath"] == "Recreate", status
    restarts = [m for _, reason, m in jobs.events("deleted") if reason == "WorkerDisrupted"]
    assert "recreating the group's pods: worker-0's pod" in restarts[0], restarts


# The failure rules hold the same whether the group is recreated (the default) or restarted in
# its own pods, where a warm launcher runs the trainers and reports their exits itself.
MODES = pytest.mark.parametrize("mode", ["Recreate", "InPlace"], ids=["recreate", "in-place"])


@MODES
def test_stopped_worker_is_a_hang_that_is_detected_and_recovered(
    jobs: Jobs, checkpoint_claim: str, mode: str
) -> None:
    # TensorFlow's own collective timeout is long here, so the operator's progress watch,
    # not a worker exiting, is what must notice the stall.
    jobs.apply(tf_job("hang", health={"progressTimeoutSeconds": 20,
                                      "collectiveTimeoutSeconds": 600},
                      restartPolicy={"backoffSeconds": 1, "mode": mode}))
    wait_checkpointed(jobs, "hang")
    signal_worker(jobs, "hang", 1, "SIGSTOP")
    stalled = jobs.wait("hang", "the hang to be declared",
                        lambda s: s if (s.get("lastFailure") or {}).get("reason")
                        == "ProgressStalled" else None, timeout=120)
    assert stalled["lastFailure"]["worker"] == 1, stalled["lastFailure"]
    jobs.wait_event("hang", "Warning", "ProgressStalled")  # recorded after the status write
    messages = [m for _, reason, m in jobs.events("hang") if reason == "ProgressStalled"]
    assert messages and "worker-1" in messages[0], jobs.events("hang")
    status = assert_resumed_and_succeeded(jobs, "hang")
    assert status["restarts"] == 1
    # In place: the launcher SIGKILLs the stopped trainer 5 s after its SIGTERM, within the
    # 15 s the operator gives the old trainers (inplace.STOP_BOUND).
    assert status["restartPath"] == ("Recreate" if mode == "Recreate" else "InPlace"), status


@MODES
def test_fail_fast_exit_code_fails_the_job_at_once(jobs: Jobs, checkpoint_claim: str,
                                                   mode: str) -> None:
    jobs.apply(tf_job(
        "failfast",
        env={"TRAIN_FAIL_AT_EPOCH": "2", "TRAIN_FAIL_EXIT_CODE": "42", "TRAIN_FAIL_WORKER": "1"},
        restartPolicy={"backoffSeconds": 1, "mode": mode,
                       "onExitCodes": [{"action": "FailJob", "values": [42]}]},
    ))
    status = jobs.wait_phase("failfast", "Failed", timeout=240)
    failed = condition(status, "Failed")
    assert failed and failed["reason"] == "ExitCodeFailsJob", status
    assert "42" in failed["message"] and "worker-1" in failed["message"], failed
    assert status["restarts"] == 0


def test_exhausted_budget_fails_the_job(jobs: Jobs, checkpoint_claim: str) -> None:
    jobs.apply(tf_job(
        "budget",
        env={"TRAIN_FAIL_AT_EPOCH": "2", "TRAIN_FAIL_EXIT_CODE": "1",
             "TRAIN_FAIL_GENERATION": "-1", "TRAIN_FAIL_WORKER": "0"},
        restartPolicy={"maxRestarts": 1, "backoffSeconds": 1},
    ))
    status = jobs.wait_phase("budget", "Failed", timeout=300)
    failed = condition(status, "Failed")
    assert failed and failed["reason"] == "RestartLimitExceeded", status
    assert status["restarts"] == 1 and status["groupGeneration"] == 1


def test_unstartable_image_ends_in_a_clear_failure(jobs: Jobs) -> None:
    manifest = tf_job("badimage", health={"startupTimeoutSeconds": 20})
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "multiworker.local/no-such-image:1"
    del manifest["spec"]["checkpoint"]
    jobs.apply(manifest)
    status = jobs.wait_phase("badimage", "Failed", timeout=120)
    failed = condition(status, "Failed")
    assert failed and failed["reason"] == "StartupTimeout", status
    assert "no-such-image" in failed["message"] or "Image" in failed["message"], failed
    assert status["restarts"] == 0
    wait_for(lambda: not [p for p in jobs.pods("badimage")
                          if p["status"].get("phase") in ("Pending", "Running")],
             60, describe="no worker left churning after the failure")
