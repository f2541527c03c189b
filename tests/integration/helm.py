"""Helm for the tests: the real helm binary against the cluster under test, and a release of
the chart installed into a test's namespace (uninstalled afterwards whatever happened)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import BIN, REPO, Cluster, load_images
from tests.conftest import LOG_DIR
from tests.support import has_failed, wait_for

CHART = REPO / "charts" / "multiworker-operator"
CRD_NAMES = ("multiworkerjobs.multiworker.dev",)
Obj = dict[str, Any]


@dataclass
class Helm:
    env: dict[str, str]  # KUBECONFIG and PATH come from here
    home: Path

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {
            **self.env,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        proc = subprocess.run([str(BIN / "helm"), *args], check=False, capture_output=True,
                              text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
            )
        return proc


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """helm's config, cache and data dirs: a temp dir, so tests never touch the user's."""
    assert (BIN / "helm").exists(), f"no helm in {BIN}: hack/cluster/build-binaries.sh builds it"
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def helm(cluster: Cluster, helm_home: Path) -> Helm:
    """The helm binary the cluster bring-up built, talking to the cluster under test."""
    return Helm(cluster.env, helm_home)


@pytest.fixture(scope="module")
def operator_image(cluster: Cluster) -> str:
    load_images(cluster, ["operator"])
    return "multiworker.local/operator:dev"


@pytest.fixture(scope="module")
def chart_crds(cluster: Cluster) -> None:
    """The chart's CRDs, created for real: custom objects can only be validated once their CRD
    exists. Like `helm install` with crds/: create what is missing, leave existing ones alone.
    """
    proc = cluster.kubectl("create", "-f", str(CHART / "crds"), check=False)
    assert proc.returncode == 0 or "AlreadyExists" in proc.stderr, proc.stderr
    cluster.wait_established(*CRD_NAMES)


def values_file(tmp_path: Path, values: Obj) -> str:
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(values))
    return str(path)


@dataclass
class Release:
    helm: Helm
    cluster: Cluster
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-multiworker-operator"

    def install(self, values: Obj, tmp_path: Path) -> None:
        self.helm("install", self.name, str(CHART), "-n", self.namespace,
                  "-f", values_file(tmp_path, values))

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check)

    def deployment(self) -> Obj:
        out = self.kubectl("get", "deployment", self.fullname, "-o", "json").stdout
        result: Obj = json.loads(out)
        return result

    def rolled_out(self) -> bool:
        """True once the Deployment's latest spec is fully rolled out and Available."""
        d = self.deployment()
        spec, status = d["spec"], d.get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return (
            status.get("observedGeneration") == d["metadata"]["generation"]
            and status.get("updatedReplicas") == spec["replicas"]
            and status.get("availableReplicas") == spec["replicas"]
            and status.get("replicas") == spec["replicas"]  # no old pods left
            and conditions.get("Available") == "True"
        )

    def wait_rolled_out(self, timeout: float = 180) -> None:
        wait_for(self.rolled_out, timeout, interval=1, describe=self.describe)

    def describe(self) -> str:
        deployment = self.kubectl("describe", "deployment", self.fullname, check=False).stdout
        pods = self.kubectl("describe", "pods", "-l",
                            f"app.kubernetes.io/instance={self.name}", check=False).stdout
        logs = self.kubectl("logs", "-l", f"app.kubernetes.io/instance={self.name}",
                            "--all-containers", "--tail=50", "--prefix", check=False)
        return (f"release {self.name} to roll out\n{deployment}\n{pods}\n"
                f"{logs.stdout}{logs.stderr}")

    def logs(self) -> str:
        proc = self.kubectl("logs", "-l", f"app.kubernetes.io/instance={self.name}",
                            "--all-containers", "--prefix", "--tail=-1", check=False)
        return proc.stdout + proc.stderr

    def lease_holder(self) -> str | None:
        """The identity (a pod name) holding the leader-election Lease of the namespace."""
        proc = self.kubectl("get", "lease", "multiworker-operator", "-o", "json", check=False)
        if proc.returncode != 0:
            return None
        holder: str | None = json.loads(proc.stdout)["spec"].get("holderIdentity")
        return holder

    def pod_metric(self, pod: str, name: str) -> float | None:
        """One sample of a metric scraped from one operator pod through the API server."""
        path = (f"/api/v1/namespaces/{self.namespace}/pods/{pod}:"
                f"{self.values_metrics_port}/proxy/metrics")
        proc = self.cluster.kubectl("get", "--raw", path, check=False)
        for line in proc.stdout.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    values_metrics_port = 8080

    def pod_names(self) -> list[str]:
        out = self.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={self.name}",
                           "--field-selector=status.phase=Running", "-o", "name").stdout
        return [line.removeprefix("pod/") for line in out.split()]


@pytest.fixture
def release(cluster: Cluster, helm: Helm, namespace: str, operator_image: str,
            request: pytest.FixtureRequest) -> Iterator[Release]:
    """A unique release name in the test's namespace; uninstalled afterwards whatever happened
    (its ClusterRole and ClusterRoleBinding outlive the namespace otherwise). On failure the
    operators' logs go to test-logs/ first: the namespace's own dump comes after the uninstall."""
    rel = Release(helm, cluster, f"mwo-{uuid.uuid4().hex[:6]}", namespace)
    yield rel
    if has_failed(request):
        out = LOG_DIR / namespace
        out.mkdir(parents=True, exist_ok=True)
        (out / f"operators-{rel.name}.log").write_text(rel.logs())
    helm("uninstall", rel.name, "-n", namespace, "--wait", "--timeout=120s", check=False)
