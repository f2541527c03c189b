"""Sidecars beside the trainer, on a real kubelet: a job with a log shipper or a service-mesh
proxy in its template ends like any other, and none of its pods outlives it holding its node.

Classic sidecars (a second container) keep a pod Running after the trainer exits, so cleanup
goes by the pod's phase. Native sidecars (an init container with `restartPolicy: Always`) are
stopped by the kubelet once the trainer exits, so the pod ends by itself."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.jobs import BASE, Jobs, job
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("images", "operator")

TRAIN_BRIEFLY = "sleep 2; exit 0"
SIDECAR = {"name": "log-shipper", "image": BASE, "imagePullPolicy": "IfNotPresent",
           "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}


def with_sidecar(manifest: dict[str, Any], native: bool) -> dict[str, Any]:
    pod = manifest["spec"]["template"]["spec"]
    if native:
        pod["initContainers"] = [{**SIDECAR, "restartPolicy": "Always"}]
    else:
        pod["containers"].append(SIDECAR)
    return manifest


def pod_phases(jobs: Jobs, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("phase", "")
            for p in jobs.pods(name) if "deletionTimestamp" not in p["metadata"]}


def test_a_classic_sidecar_does_not_keep_a_finished_jobs_pods(jobs: Jobs) -> None:
    jobs.apply(with_sidecar(job("classic", TRAIN_BRIEFLY, workers=2), native=False))
    jobs.wait_phase("classic", "Succeeded")
    # The trainers exited 0, the log shippers run on: the pods are Running until deleted.
    wait_for(lambda: not [p for p in pod_phases(jobs, "classic").values() if p == "Running"],
             60, describe=lambda: f"pods still Running: {pod_phases(jobs, 'classic')}")


def test_a_native_sidecar_job_succeeds_and_its_pods_end(jobs: Jobs) -> None:
    jobs.apply(with_sidecar(job("native", TRAIN_BRIEFLY, workers=2), native=True))
    status = jobs.wait_phase("native", "Succeeded")
    assert status["restarts"] == 0 and status["disruptions"] == 0
    wait_for(lambda: not [p for p in pod_phases(jobs, "native").values() if p == "Running"],
             60, describe=lambda: f"pods still Running: {pod_phases(jobs, 'native')}")


def test_a_sidecar_inserted_first_into_a_running_job_waits_for_the_next_group(
    jobs: Jobs,
) -> None:
    """The job trains in `main` (no container named tensorflow: the first one trains). A
    sidecar inserted first must not make the running pods look like pods that never started
    (they were judged by the edited template: Failed, StartupTimeout); the edit takes effect
    with the next group."""
    manifest = job("edited", "exec sleep 3600", workers=2,
                   health={"startupTimeoutSeconds": 5})
    manifest["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    jobs.apply(manifest)
    jobs.wait_running("edited")
    template = manifest["spec"]["template"]
    template["spec"]["containers"].insert(0, SIDECAR)
    jobs.patch_spec("edited", template=template)
    deadline = time.monotonic() + 20  # four startup timeouts
    while time.monotonic() < deadline:
        status = jobs.status("edited")
        assert status["phase"] == "Running" and status.get("restarts", 0) == 0, \
            jobs.describe("edited")
        time.sleep(1)
    assert {p["metadata"]["annotations"]["multiworker.dev/trainer-container"]
            for p in jobs.pods("edited")} == {"main"}
