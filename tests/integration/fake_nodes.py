"""Nodes with no kubelet, for tests on a real API server: the test keeps each one's Lease
renewed and sets its Ready condition, labels and GPU capacity. Pods bound to one never run
and never finish terminating, unless the test writes their status as a kubelet would.

Each carries a NoSchedule taint (FakeNode.TAINT): only pods with FakeNode.TOLERATION land
there. Untainted, a fake node took the pods of any test running beside the one that made it
once the real node was full: bound there, they waited forever, not Pending until room came."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from typing import ClassVar

from tests.cluster import Cluster


class FakeNode:
    """A Node with no kubelet: the test keeps its Lease renewed (so Kubernetes thinks it is
    alive) and sets its Ready condition. Pods bound to it never run and never finish
    terminating — exactly what a partitioned node looks like."""

    TAINT: ClassVar[dict[str, str]] = {
        "key": "multiworker.test/fake-node", "value": "true", "effect": "NoSchedule"}
    TOLERATION: ClassVar[dict[str, str]] = {
        "key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}

    def __init__(self, cluster: Cluster, labels: dict[str, str] | None = None,
                 gpus: int = 0) -> None:
        self.cluster = cluster
        self.name = f"mw-fake-{uuid.uuid4().hex[:6]}"
        self.labels = {"mw-fake-node": self.name, **(labels or {})}
        self.gpus = gpus
        self.alive = threading.Event()
        self.alive.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)

    def create(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": self.labels},
                "spec": {"taints": [self.TAINT]}}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        self.set_ready(True)
        self._thread.start()

    def set_ready(self, ready: bool) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {"cpu": "8", "memory": "16Gi", "pods": "20",
                     **({"nvidia.com/gpu": str(self.gpus)} if self.gpus else {})}
        status = {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "TestPartition",
                            "message": "ready" if ready else "the test cut this node off",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
        self.cluster.kubectl("patch", "node", self.name, "--subresource=status",
                             "--type=merge", "-p", json.dumps(status))

    def _heartbeat(self) -> None:
        """Renews the Lease every 5 s while `alive` is set (clear it: a silent kubelet)."""
        while not self._stop.wait(5):
            if not self.alive.is_set():
                continue
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                     "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40,
                              "renewTime": now}}
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(lease), check=False)

    def delete(self) -> None:
        self._stop.set()
        self.cluster.kubectl("delete", "node", self.name, "--wait=false", check=False)
        self.cluster.kubectl("-n", "kube-node-lease", "delete", "lease", self.name,
                             "--ignore-not-found", check=False)
