"""The watch-fed caches keep what a pass reads and nothing more, one copy at a time."""

from __future__ import annotations

import json
import time
from typing import Any

from multiworker.clients.informer import Informer, Store, key_of
from multiworker.clients.shapes import POD, slim_pod
from multiworker.decide.workers import WorkerPhase, classify

from tests.support import wait_for
from tests.unit.builders import PodBuilder


def kubelet_pod() -> dict[str, Any]:
    """A running worker pod as the API server sends it, with the heavy parts users add."""
    pod = PodBuilder(1).running().build()
    pod["metadata"]["annotations"] = {
        "multiworker.dev/trainer-container": "tensorflow",
        "example.com/config": "x" * 200_000,  # a user's annotation: up to 256 KiB
        "kubectl.kubernetes.io/last-applied-configuration": "{}"}
    pod["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    pod["metadata"].update(namespace="ns", resourceVersion="1")
    pod["spec"] = {"nodeName": "node-1"}
    pod["spec"]["containers"] = [{
        "name": "tensorflow", "image": "w", "command": ["python3", "train.py"],
        "env": [{"name": f"V{i}", "value": "y" * 100} for i in range(100)],
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    pod["spec"]["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(50)]
    pod["status"]["containerStatuses"][0].update(
        imageID="sha256:abc", ready=True, containerID="containerd://" + "f" * 64, started=True,
        lastState={}, restartCount=0, allocatedResources={"cpu": "1"})
    return pod


def test_a_cached_pod_keeps_what_passes_read_and_drops_the_rest() -> None:
    pod = kubelet_pod()
    slim = slim_pod(pod)
    assert slim["metadata"]["annotations"] == {"multiworker.dev/trainer-container": "tensorflow"}
    assert "managedFields" not in slim["metadata"]
    assert slim["spec"]["containers"] == [{"name": "tensorflow",
                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    assert set(slim["status"]["containerStatuses"][0]) <= {
        "name", "state", "lastState", "restartCount", "imageID", "ready"}
    assert len(json.dumps(slim)) < 2_000
    assert len(json.dumps(pod)) > 200_000
    assert classify(slim, 1, "tensorflow") == classify(pod, 1, "tensorflow")
    assert classify(slim, 1, "tensorflow").phase is WorkerPhase.RUNNING


class Pages:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def list_page(self, *_: Any) -> dict[str, Any]:
        return {"items": self.items, "metadata": {"resourceVersion": "9"}}


def test_a_relist_keeps_the_cached_copy_of_an_unchanged_object() -> None:
    """A relist (after 410 Gone) held the whole new list beside the whole cache: twice the
    memory at 8,000 pods. What did not change is kept as the one copy the cache has."""
    unchanged, changed = kubelet_pod(), kubelet_pod()
    changed["metadata"].update(name="demo-worker-2", resourceVersion="2")
    store = Store()
    informer = Informer(Pages([unchanged, changed]), "/api/v1/pods", store,  # type: ignore[arg-type]
                        lambda *_: None, None, None, POD)
    informer._relist()
    first = store.get(key_of(unchanged))
    changed["metadata"]["resourceVersion"] = "3"
    informer._relist()
    assert store.get(key_of(unchanged)) is first  # the same object, not a second copy
    assert store.get(key_of(changed))["metadata"]["resourceVersion"] == "3"  # type: ignore[index]


class Outage:
    """An API server whose watch fails twice, then delivers one event."""

    def __init__(self) -> None:
        self.watches = 0

    def list_page(self, *_: Any) -> dict[str, Any]:
        return {"items": [], "metadata": {"resourceVersion": "9"}}

    def watch(self, *_: Any) -> Any:
        self.watches += 1
        if self.watches <= 2:
            raise ConnectionResetError("the API server restarts")
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "10"}}}
        time.sleep(0.1)  # a watch that ends (the server's timeout) is opened again


def test_the_watch_says_when_it_fails_and_when_it_delivers_again() -> None:
    """What the Lease watch did not hear while it was down did not happen unheard: it tells
    heartbeats.py (on_state) so a stalled watch does not make every node look lost."""
    told: list[bool] = []
    cluster = Outage()
    informer = Informer(cluster, "/leases", Store(), lambda *_: None,  # type: ignore[arg-type]
                        on_state=told.append)
    informer.start()
    try:
        wait_for(lambda: cluster.watches >= 3 and told == [False, True], 10,
                 describe=lambda: f"down, then up once: {told}")
    finally:
        informer.stop()
