"""E2e tier: real TensorFlow worker pods, the real operator, and a checkpoint volume per test."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster import Cluster
from tests.integration.conftest import (  # noqa: F401  (shared fixtures)
    chart_env,
    crds,
    jobs,
    operator,
)
from tests.integration.test_helm import (  # noqa: F401  (the Helm tests' release fixtures)
    chart_crds,
    helm,
    helm_home,
    operator_image,
    release,
)


@pytest.fixture
def checkpoint_claim(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A claim named `checkpoints`, bound to a fresh hostPath volume of this test alone.

    hostPath is enough on a single-node cluster (every worker shares the node); on a multi-node
    cluster set MW_E2E_STORAGE_CLASS to a ReadWriteMany class instead.
    """
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "checkpoints"},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                      "resources": {"requests": {"storage": "1Gi"}}}}
    volume_name = f"mwj-e2e-{namespace}"[:63]
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume_name},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "",
                       "claimRef": {"namespace": namespace, "name": "checkpoints"},
                       "hostPath": {"path": f"/var/lib/multiworker/e2e/{namespace}",
                                    "type": "DirectoryOrCreate"}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    yield "checkpoints"
    cluster.kubectl("delete", "pv", volume_name, "--wait=false", check=False)
