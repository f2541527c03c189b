"""Where a group's workers land and what they run, on a real API server and scheduler: one GPU
product per group (nodes labelled `nvidia.com/gpu.product`, as NVIDIA's GPU feature discovery
does), and a tag that resolved to different digests on different nodes. The nodes are kubelet-
less Node objects (fake_nodes.py); where a kubelet would report a pod's image, the test writes
that status itself."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.conftest import USES_FAKE_NODES
from tests.integration.fake_nodes import FakeNode
from tests.integration.jobs import BASE, Jobs, condition, generation_of, job
from tests.support import wait_for

# Its fake GPU nodes are tainted (other tests' pods never land there) and their products are
# candidates only for jobs that tolerate them (creation.usable_nodes).
pytestmark = [pytest.mark.usefixtures("images", "operator"), USES_FAKE_NODES]

SLEEP = "exec sleep 3600"
PRODUCT = "nvidia.com/gpu.product"


@pytest.fixture
def gpu_nodes(cluster: Cluster) -> Iterator[dict[str, FakeNode]]:
    """Two products, by product name: a small one (2 GPUs) and a big one (4 GPUs); names of
    this test alone, so nodes of other tests never count."""
    tag = uuid.uuid4().hex[:6]
    nodes = {product: FakeNode(cluster, {PRODUCT: product, "mw-gpu-test": tag}, gpus)
             for product, gpus in ((f"TEST-A100-{tag}", 2), (f"TEST-T4-{tag}", 4))}
    for node in nodes.values():
        node.create()
    yield nodes
    for node in nodes.values():
        node.delete()


def gpu_job(name: str, workers: int, nodes: dict[str, FakeNode]) -> dict[str, Any]:
    manifest = job(name, SLEEP, workers=workers)
    spec = manifest["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"mw-gpu-test": next(iter(nodes.values())).labels["mw-gpu-test"]}
    spec["tolerations"] = [FakeNode.TOLERATION]
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return manifest


def test_a_group_goes_whole_to_the_gpu_product_that_holds_it(
    jobs: Jobs, gpu_nodes: dict[str, FakeNode]
) -> None:
    _, big = gpu_nodes  # 3 workers fit only on the big product
    jobs.apply(gpu_job("train", 3, gpu_nodes))
    status = jobs.wait("train", "status.gpuProduct", lambda s: s if s.get("gpuProduct") else None)
    assert status["gpuProduct"] == big, status

    def bound() -> dict[str, str] | None:
        found = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in jobs.pods("train")}
        return found if len(found) == 3 and all(found.values()) else None
    placed = wait_for(bound, 60, describe=lambda: f"3 workers bound\n{jobs.describe('train')}")
    assert set(placed.values()) == {gpu_nodes[big].name}, placed
    assert {p["spec"]["nodeSelector"][PRODUCT] for p in jobs.pods("train")} == {big}


def test_a_group_no_single_product_can_hold_waits_and_says_why(
    jobs: Jobs, gpu_nodes: dict[str, FakeNode]
) -> None:
    small, big = gpu_nodes  # 2 + 4 GPUs: 5 workers would fit only by mixing
    jobs.apply(gpu_job("wide", 5, gpu_nodes))

    def naming_both(s: dict[str, Any]) -> dict[str, Any] | None:
        # A pass before the operator's node watch delivered both nodes names one product (CI
        # on a loaded machine); the second node's arrival wakes the job, and that pass names
        # both.
        c = condition(s, "Running")
        good = c is not None and c["reason"] == "NoGpuProductWithRoom" and \
            all(f"{product} holds" in c["message"] for product in gpu_nodes)
        return s if good else None

    status = jobs.wait("wide", "a NoGpuProductWithRoom condition naming both products",
                       naming_both)
    message = condition(status, "Running")["message"]  # type: ignore[index]
    assert message.startswith("no single GPU product has room for 5 workers × 1 GPUs"), message
    assert f"{small} holds 2" in message and f"{big} holds 4" in message, message
    assert jobs.pods("wide") == []  # nothing placed, nothing mixed
    jobs.wait_event("wide", "Warning", "NoGpuProductWithRoom")


def report_running(jobs: Jobs, pod: str, image_id: str) -> None:
    """What a kubelet writes once the container runs: the digest its node resolved."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{
            "name": "tensorflow", "image": BASE, "imageID": image_id, "ready": True,
            "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}]}}
    jobs.kubectl("patch", "pod", pod, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status))


def test_workers_on_different_digests_restart_pinned_to_the_chiefs(
    jobs: Jobs, fake_node: FakeNode
) -> None:
    manifest = job("skew", SLEEP, workers=3)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"mw-fake-node": fake_node.name}
    manifest["spec"]["template"]["spec"]["tolerations"] = [FakeNode.TOLERATION]
    jobs.apply(manifest)
    wait_for(lambda: len([p for p in jobs.pods("skew") if p["spec"].get("nodeName")]) == 3,
             60, describe="3 workers bound to the fake node")
    repo = BASE.split(":")[0]
    chief, odd = f"{repo}@sha256:{'a' * 64}", f"{repo}@sha256:{'b' * 64}"
    for index, image_id in ((0, chief), (1, odd), (2, chief)):
        report_running(jobs, f"skew-worker-{index}", image_id)

    status = jobs.wait("skew", "a restart pinned to the chief's digest",
                       lambda s: s if s.get("pinnedImage") else None)
    assert status["pinnedImage"] == chief, status
    assert (status["disruptions"], status["restarts"]) == (1, 0), status
    skew = [m for t, r, m in jobs.events("skew") if (t, r) == ("Warning", "ImageSkew")]
    assert skew and f"worker-1 {odd}" in skew[0] and f"worker-0 {chief}" in skew[0], skew

    # The old pods are deleted; with no kubelet to finish that, the test does it.
    wait_for(lambda: all("deletionTimestamp" in p["metadata"] for p in jobs.pods("skew")
                         if generation_of(p) == 0), 60, describe="generation 0 deleted")
    for index in range(3):
        jobs.kubectl("delete", "pod", f"skew-worker-{index}", "--grace-period=0", "--force",
                     check=False)

    def next_group() -> list[dict[str, Any]] | None:
        pods = [p for p in jobs.pods("skew") if generation_of(p) == 1]
        return pods if len(pods) == 3 else None
    pods = wait_for(next_group, 60, describe=lambda: f"generation 1\n{jobs.describe('skew')}")
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {chief}
