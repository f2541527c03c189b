"""Checkpoints of different jobs never mix on a shared claim: a second job, and a job deleted
and applied again under the same name, train from step 0; spec.checkpoint.resumeFrom continues
another run on purpose. Real TensorFlow pods, the synthetic trainer (fast, known steps)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.jobs import Jobs, env_of

pytestmark = pytest.mark.usefixtures("worker_image", "operator")

TRAIN = "/opt/multiworker/examples/training/train.py"
STEPS_PER_EPOCH = 10


def job(name: str, epochs: int, **checkpoint: str) -> dict[str, Any]:
    """Two workers, `epochs` epochs of 10 steps, checkpoints on the test's claim."""
    env = {"TRAIN_EPOCHS": str(epochs), "TRAIN_STEPS_PER_EPOCH": str(STEPS_PER_EPOCH),
           "TRAIN_TARGET_LOSS": "1000"}  # the loss target is beside the point here
    container = {
        "name": "tensorflow", "image": "multiworker.local/worker:dev",
        "imagePullPolicy": "IfNotPresent", "args": ["python3", TRAIN],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    return {
        "apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {"workers": 2, "checkpoint": {"claimName": "checkpoints", **checkpoint},
                 "restartPolicy": {"maxRestarts": 0},
                 "template": {"spec": {"terminationGracePeriodSeconds": 5,
                                       "containers": [container]}}},
    }


def run_to_success(jobs: Jobs, name: str) -> tuple[str, str]:
    """Waits for Succeeded; returns the chief's log and its checkpoint directory."""
    jobs.wait_phase(name, "Succeeded", timeout=300)
    chief = f"{name}-worker-0"
    log = jobs.kubectl("logs", chief, "-c", "tensorflow").stdout
    pod = next(p for p in jobs.pods(name) if p["metadata"]["name"] == chief)
    return log, env_of(pod)["MWJ_CHECKPOINT_DIR"]


def trained_from_scratch(log: str, epochs: int) -> bool:
    last = f"epoch {epochs}/{epochs} done: step {epochs * STEPS_PER_EPOCH},"
    return "] restored /" not in log and "] resuming" not in log and last in log


def test_jobs_sharing_a_claim_and_a_recreated_job_train_from_step_zero(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    jobs.apply(job("first", epochs=2))
    first_log, first_dir = run_to_success(jobs, "first")
    assert trained_from_scratch(first_log, 2), first_log
    jobs.kubectl("delete", "mwj", "first", "--wait=true")

    # The same name again, and another job, both on the claim that holds first's checkpoint.
    jobs.apply(job("first", epochs=2))
    jobs.apply(job("second", epochs=2))
    again_log, again_dir = run_to_success(jobs, "first")
    second_log, second_dir = run_to_success(jobs, "second")

    assert trained_from_scratch(again_log, 2), again_log
    assert trained_from_scratch(second_log, 2), second_log
    assert len({first_dir, again_dir, second_dir}) == 3
    ns = jobs.namespace
    for directory, name in [(first_dir, "first"), (again_dir, "first"), (second_dir, "second")]:
        assert re.fullmatch(rf"/checkpoints/{ns}/{name}-[0-9a-f-]{{36}}", directory), directory


def test_resume_from_continues_another_run_on_purpose(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    jobs.apply(job("earlier", epochs=2))
    _, earlier_dir = run_to_success(jobs, "earlier")
    relative = earlier_dir.removeprefix("/checkpoints/")

    jobs.apply(job("later", epochs=4, resumeFrom=relative))
    log, later_dir = run_to_success(jobs, "later")

    assert later_dir != earlier_dir
    assert f"resuming on purpose (spec.checkpoint.resumeFrom) from {earlier_dir}/ckpt-20" in log
    assert f"written by job {jobs.namespace}/earlier" in log
    assert "resuming from step 20 (epoch 3, batch 0)" in log, log
    assert "epoch 4/4 done: step 40," in log and "epoch 2/4 done" not in log


# Run inside a worker: claim its checkpoint directory for generation argv[1] as that
# generation's chief would (fence.json, written whole), then print the trainer's step.
CLAIM_FOR_NEXT_GENERATION = """
import json, os, sys, time, urllib.request
directory = os.environ["MWJ_CHECKPOINT_DIR"]
fence = {"generation": int(sys.argv[1]), "jobUid": os.environ["MWJ_JOB_UID"],
         "pod": "e2e-next-generation", "writtenAt": time.time()}
with open(os.path.join(directory, ".fence.e2e"), "w") as f:
    json.dump(fence, f)
os.replace(os.path.join(directory, ".fence.e2e"), os.path.join(directory, "fence.json"))
url = f"http://127.0.0.1:{os.environ['MWJ_PROGRESS_PORT']}/progress"
print(json.load(urllib.request.urlopen(url, timeout=5))["step"])
"""


def test_a_group_superseded_while_it_trains_stops_without_saving_again(
    jobs: Jobs, checkpoint_claim: str
) -> None:
    """What a zombie group meets — one on a node cut off from the control plane, whose pods
    the API has forgotten — when a newer generation of its job claims the checkpoint directory:
    here the claim is written by hand into the running group's directory, as the next
    generation's chief writes it. Every trainer stops at its next save with exit 5 (superseded)
    and saves nothing more; the next generation, the one the claim names, resumes from a
    checkpoint made before the claim."""
    manifest = job("fenced", epochs=30)
    manifest["spec"]["restartPolicy"] = {"maxRestarts": 1, "backoffSeconds": 1}
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] += [
        {"name": "TRAIN_STEP_SLEEP", "value": "0.1"}]
    jobs.apply(manifest)
    status = jobs.wait("fenced", "a checkpoint reported in status.progress",
                       lambda s: s if (s.get("progress") or {}).get("lastCheckpointStep")
                       else None, timeout=180)
    generation = status["groupGeneration"]
    out = jobs.kubectl("exec", "fenced-worker-0", "-c", "tensorflow", "--", "python3", "-c",
                       CLAIM_FOR_NEXT_GENERATION, str(generation + 1)).stdout
    step_at_claim = int(out.split()[-1])

    restarted = jobs.wait_running("fenced", generation=generation + 1, timeout=180)
    failure = restarted["lastFailure"]
    assert failure["exitCode"] == 5, failure
    assert f"superseded: generation {generation + 1} of this job claimed" in \
        failure["message"], failure
    final = jobs.wait_phase("fenced", "Succeeded", timeout=300)
    resumed = (final.get("progress") or {}).get("resumedFromStep") or 0
    # Nothing saved after the claim: any checkpoint is of a step reached by then.
    assert 0 < resumed <= step_at_claim, (resumed, step_at_claim)
    assert final["restarts"] == 1, final
