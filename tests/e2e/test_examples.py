"""Every manifest in examples/ is applied here and runs to its end, on whichever cluster the
suite runs against. What had to change for a test namespace is changed below and nothing else:
the example volume's cluster-wide name and host path (`make run` may own the originals), and
for the GPU job the image (the GPU image is never built here: TensorFlow runs on CPU while the
node's advertised nvidia.com/gpu are really requested) and its memory limit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import REPO, Cluster
from tests.e2e.test_gang import free_gpus, gpu_node  # noqa: F401 (fixtures)
from tests.integration.helm import Release
from tests.integration.jobs import Jobs, env_of
from tests.support import USES_NODE_GPUS, alone, wait_for

EXAMPLES = REPO / "examples"
APPLIED_HERE = {"checkpoint-pvc.yaml", "cpu-job.yaml", "gpu-job.yaml", "elastic-job.yaml",
                "keras-job.yaml"}  # the last in test_keras.py
Obj = dict[str, Any]


def example(name: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def test_every_example_is_applied_by_a_test() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == APPLIED_HERE


@pytest.fixture
def example_claim(cluster: Cluster, jobs: Jobs) -> Any:
    """examples/checkpoint-pvc.yaml in the test namespace, its volume renamed for the test."""
    volume, claim = example("checkpoint-pvc.yaml")
    volume["metadata"]["name"] = f"mwj-example-{jobs.namespace}"[:63]
    # Under the folder every node sees alike (kind: several nodes), like the example's own.
    volume["spec"]["hostPath"]["path"] = f"{cluster.shared_dir}/e2e/{jobs.namespace}-example"
    volume["spec"]["persistentVolumeReclaimPolicy"] = "Delete"
    claim["spec"]["volumeName"] = volume["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(volume))
    jobs.apply(claim)
    yield claim["metadata"]["name"]
    cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)
    cluster.remove_shared(f"e2e/{jobs.namespace}-example")


def held_out_accuracy(jobs: Jobs, pod: str) -> float:
    log = jobs.kubectl("logs", pod, "-c", "tensorflow").stdout
    found = re.search(r"held-out accuracy (\d\.\d+) on 360 images", log)
    assert found and "target reached" in log, log[-3000:]
    end = [line for line in log.splitlines()
           if re.search(r"epoch \d+/\d+ done|checkpoint saved|model saved|held-out|\] done", line)]
    print(f"{pod}, the end of its run:", *end[-5:], sep="\n  ")  # shown with pytest -rP
    return float(found.group(1))


@pytest.mark.usefixtures("worker_image", "chart_crds")
@alone("its workers and the chart's operators request 1.7 of the node's 2 CPUs")
def test_cpu_example_learns_the_digits_through_the_helm_installed_operator(
    release: Release, jobs: Jobs, example_claim: str, tmp_path: Path
) -> None:
    """The path a user takes (`helm install`, then the two example files); the operator runs in
    a pod, so it reaches the workers' progress endpoints over the pod network."""
    release.install({"watchNamespaces": [release.namespace]}, tmp_path)
    release.wait_rolled_out()
    (manifest,) = example("cpu-job.yaml")
    assert manifest["spec"]["checkpoint"]["claimName"] == example_claim
    name = manifest["metadata"]["name"]
    jobs.apply(manifest)

    status = jobs.wait_phase(name, "Succeeded", timeout=420)

    assert status["restarts"] == 0 and status["disruptions"] == 0, status
    progress = status.get("progress") or {}
    # Training accuracy as last polled (held-out accuracy below, from the chief's own check).
    assert progress.get("step", 0) > 0 and 0 < (progress.get("accuracy") or 0) <= 1, status
    # The Event follows the status write; on a busy cluster it can take a moment to list.
    wait_for(lambda: any(reason == "ChiefSucceeded" for _, reason, _ in jobs.events(name)), 30,
             describe=lambda: f"a ChiefSucceeded Event\n{jobs.describe(name)}")
    chief = f"{name}-worker-0"
    assert held_out_accuracy(jobs, chief) >= 0.9
    uid = jobs.get(name)["metadata"]["uid"]  # type: ignore[index]
    pod = jobs.kubectl("get", "pod", chief, "-o", "json", check=True)
    assert env_of(yaml.safe_load(pod.stdout))["MWJ_CHECKPOINT_DIR"] == (
        f"/checkpoints/{jobs.namespace}/{name}-{uid}")


@pytest.mark.usefixtures("worker_image", "operator", "free_gpus")
@USES_NODE_GPUS
@pytest.mark.parametrize("file", ["gpu-job.yaml", "elastic-job.yaml"])
def test_gpu_example_requests_a_gpu_per_worker_and_learns(
    jobs: Jobs, checkpoint_claim: str, file: str
) -> None:
    """The GPU example, and the elastic one (the same job with spec.elastic: whole here, its
    4 GPUs free, so it trains at full size; test_elastic.py shrinks one)."""
    (manifest,) = example(file)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    container["image"] = "multiworker.local/worker:dev"
    container["resources"]["limits"]["memory"] = "1Gi"
    name, workers = manifest["metadata"]["name"], manifest["spec"]["workers"]
    jobs.apply(manifest)
    # Read the pods while the group trains: once the chief exits 0, cleanPodPolicy Running
    # deletes a worker that has not ended yet (CI saw 2 of 4 left on a busy machine).
    def every_pod() -> list[Obj] | None:
        pods = jobs.pods(name)
        return pods if len(pods) == workers else None

    pods = wait_for(every_pod, 240, describe=lambda: f"{workers} pods: {jobs.describe(name)}")
    for pod in pods:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1", limits

    status = jobs.wait_phase(name, "Succeeded", timeout=480)

    assert (status["restarts"], status["totalWorkers"]) == (0, workers), status
    assert held_out_accuracy(jobs, f"{name}-worker-0") >= 0.9
