"""E2e tier: real TensorFlow worker pods, the real operator, and a checkpoint volume per test.

Tests marked `multinode` need two schedulable worker nodes: they are deselected on the
single-node local cluster (CLUSTER=local), run on kind (whose cluster has two workers, so
fewer is a failure there) and are skipped on an existing cluster that has fewer.
Figures a test measures (`record_property("figure: ...", value)`) are printed at the end
(tests/conftest.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.integration.conftest import (  # noqa: F401  (shared fixtures)
    chart_crds,
    chart_env,
    crds,
    helm,
    helm_home,
    jobs,
    operator,
    operator_image,
    release,
)

MULTINODE = "multinode"
DESELECTED = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MULTINODE}: needs two or more schedulable worker nodes (CLUSTER=kind)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The local cluster has one node by construction: multi-node tests are not for it."""
    if os.environ.get("CLUSTER", "local") != "local":
        return
    dropped = [item for item in items if item.get_closest_marker(MULTINODE)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker(MULTINODE)]
        config.stash[DESELECTED] = (
            f"{len(dropped)} multi-node e2e tests deselected: the local cluster has one node "
            "(run them with CLUSTER=kind)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    note = terminalreporter.config.stash.get(DESELECTED, "")
    if note:
        terminalreporter.write_line(note)


@pytest.fixture
def worker_nodes(cluster: Cluster) -> list[str]:
    """The schedulable worker nodes, at least two (a multi-node test's precondition)."""
    nodes = cluster.schedulable_workers()
    if len(nodes) < 2:
        message = f"needs 2 schedulable worker nodes, the {cluster.kind} cluster has {nodes}"
        if cluster.kind == "existing":
            pytest.skip(message)
        raise AssertionError(message)
    return nodes


@pytest.fixture
def checkpoint_claim(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A ReadWriteMany claim named `checkpoints`, fresh for this test.

    With MW_E2E_STORAGE_CLASS set, that class provisions it (what a real multi-node cluster
    needs: a ReadWriteMany class such as NFS or CephFS). Otherwise it is bound to a hostPath
    volume of this test alone, under the cluster's shared directory: the single local node's
    disk, or on kind the host directory mounted into every node, so workers on different nodes
    see the same checkpoints.
    """
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                                  "resources": {"requests": {"storage": "1Gi"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "checkpoints"}, "spec": claim_spec}
    storage_class = os.environ.get("MW_E2E_STORAGE_CLASS")
    if storage_class:
        claim_spec["storageClassName"] = storage_class
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
        yield "checkpoints"
        return
    if cluster.shared_dir is None:
        pytest.skip("no directory shared by every node is known: set MW_E2E_STORAGE_CLASS "
                    "to a ReadWriteMany storage class")
    claim_spec["storageClassName"] = ""
    volume_name = f"mwj-e2e-{namespace}"[:63]
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume_name},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "claimRef": {"namespace": namespace, "name": "checkpoints"},
                       "hostPath": {"path": f"{cluster.shared_dir}/e2e/{namespace}",
                                    "type": "DirectoryOrCreate"}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    yield "checkpoints"
    cluster.kubectl("delete", "pv", volume_name, "--wait=false", check=False)
    cluster.remove_shared(f"e2e/{namespace}")
