"""spec.elastic with real TensorFlow on the local cluster's 4-GPU node: a pod of another
namespace holds two GPUs, so a 3-worker job (minWorkers 2) is placed 2 of 3; after
shrinkAfterSeconds it trains with 2, and once the GPUs are free for growAfterSeconds it grows
back to 3 at a checkpoint and succeeds, resuming from it, with no budget spent. Under
ScaleLearningRate each worker keeps its batch, so the global batch follows the size, and the
runtime's sample count shows every sample trained once."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.e2e.test_gang import GPU, free_gpus, gpu_node, pin_to  # noqa: F401 (fixtures)
from tests.e2e.test_recovery import tf_job, wait_checkpointed
from tests.integration.jobs import Jobs
from tests.support import USES_NODE_GPUS, wait_for

pytestmark = [USES_NODE_GPUS, pytest.mark.usefixtures("worker_image", "operator")]


def hog(name: str, gpus: int, node: str) -> dict[str, Any]:
    """A pod of no job that holds `gpus` of the node's GPUs until deleted."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "hog", "image": "multiworker.local/worker:dev",
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", "3600"],
                                     "resources": {"limits": {GPU: str(gpus)}}}]}}


def events_of(jobs: Jobs, name: str, reason: str, timeout: float = 30) -> list[str]:
    """The messages of job `name`'s Events of `reason`, once there is one: the operator
    records Events after the status write a test waits on (read at once, CI found none)."""
    def found() -> list[str] | None:
        return [m for _, r, m in jobs.events(name) if r == reason] or None
    return wait_for(found, timeout, describe=lambda: f"a {reason} Event: {jobs.events(name)}")


SIZED = re.compile(r"(\d+) of (\d+) workers: global batch (\d+), learning rate ([0-9.e-]+), "
                   r"from sample (\d+) \(step (\d+)\)")


def sized_start(jobs: Jobs, name: str, workers: int, timeout: float = 300) -> tuple[int, int]:
    """(sample, step) the running generation of `workers` started from, as its chief logged it
    (runtime.fit's count: ScaleLearningRate's global batch follows the size)."""
    def logged() -> tuple[int, int] | None:
        out = jobs.kubectl("logs", f"{name}-worker-0", "-c", "tensorflow", check=False).stdout
        found = [m for m in SIZED.finditer(out) if int(m[1]) == workers]
        return (int(found[-1][5]), int(found[-1][6])) if found else None
    result: tuple[int, int] = wait_for(logged, timeout,
                                       describe=f"the chief of a {workers}-worker generation")
    return result


def trained_samples(jobs: Jobs, name: str) -> tuple[int, int]:
    """(step, samples) the chief ended with: `trained to step N on samples [0, M)`."""
    out = jobs.kubectl("logs", f"{name}-worker-0", "-c", "tensorflow").stdout
    found = re.search(r"trained to step (\d+) on samples \[0, (\d+)\)", out)
    assert found, out[-3000:]
    return int(found[1]), int(found[2])


def test_a_group_short_of_gpus_shrinks_trains_on_and_grows_back(
    jobs: Jobs, checkpoint_claim: str, gpu_node: str, free_gpus: None,  # noqa: F811
    record_property: Any, request: pytest.FixtureRequest,
) -> None:
    # Another tenant: a pod in a namespace of its own, which the operator does not watch.
    other = f"{jobs.namespace}-other"[:63]
    jobs.cluster.kubectl("create", "namespace", other)
    request.addfinalizer(lambda: jobs.cluster.kubectl("delete", "namespace", other,
                                                      "--wait=false", check=False))
    jobs.cluster.kubectl("-n", other, "apply", "-f", "-",
                         input=json.dumps(hog("hog", 2, gpu_node)))
    manifest = tf_job("elastic", workers=3, env={"TRAIN_EPOCHS": "30"},
                      elastic={"minWorkers": 2, "shrinkAfterSeconds": 10,
                               "growAfterSeconds": 10, "batch": "ScaleLearningRate"},
                      health={"startupTimeoutSeconds": 600})
    pin_to(manifest, gpu_node)
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {GPU: "1"}
    jobs.apply(manifest)
    applied = time.monotonic()
    shrunk = jobs.wait("elastic", "the group shrunk to 2",
                       lambda s: s if s.get("groupWorkers") == 2 and s.get("resizes") == 1
                       else None, timeout=180)
    assert (shrunk.get("restarts", 0), shrunk.get("disruptions", 0)) == (0, 0), shrunk
    assert "1 of 3 workers could not be placed" in events_of(jobs, "elastic", "Shrunk")[0]
    assert sized_start(jobs, "elastic", 2) == (0, 0)  # 32 per worker: 64 a step
    shrunk_in = time.monotonic() - applied
    wait_checkpointed(jobs, "elastic")
    # The hog's GPUs are not room (the operator asks the API what the node's pods hold).
    held = jobs.wait("elastic", "the room measured",
                     lambda s: s if s.get("phase") == "Running" and "roomWorkers" in s
                     else None, timeout=120)
    assert held["roomWorkers"] == 2 and held.get("roomSince") is None, held
    time.sleep(12)  # longer than growAfterSeconds
    assert jobs.get("elastic")["status"]["resizes"] == 1
    jobs.cluster.kubectl("-n", other, "delete", "pod", "hog", "--wait=false")
    freed = time.monotonic()
    grown = jobs.wait("elastic", "the group grown back to 3",
                      lambda s: s if s.get("resizes") == 2 else None, timeout=180)
    assert grown.get("groupWorkers") is None, grown
    assert "growing from 2 to 3 of 3" in events_of(jobs, "elastic", "Grew")[0]
    sample, step = sized_start(jobs, "elastic", 3)
    grown_in = time.monotonic() - freed
    record_property("figure: GPUs short at apply -> training with 2 of 3 (s; shrinkAfter 10)",
                    round(shrunk_in, 1))
    record_property("figure: GPUs freed -> training with 3 of 3 (s; growAfter 10)",
                    round(grown_in, 1))
    assert step > 0 and sample == step * 64  # the coordinated checkpoint's count
    status = jobs.wait_phase("elastic", "Succeeded", timeout=600)
    last, samples = trained_samples(jobs, "elastic")
    assert samples == sample + (last - step) * 96, (sample, step, last, samples)
    assert (status["totalWorkers"], status.get("restarts", 0), status.get("disruptions", 0)) \
        == (3, 0, 0), status
    assert (status.get("progress") or {}).get("resumedFromStep", 0) > 0, status
