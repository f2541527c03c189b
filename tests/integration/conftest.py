"""Integration tier: the CRD from crds/ on a real API server, and the real operator process.

`operator` starts `multiworker-operator --namespace <test namespace>` as a subprocess (so each
test has its own operator watching only its own namespace, with leader election on as in
production), waits for its health endpoint, and saves its log to
test-logs/<namespace>/operator.log when the test fails.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import REPO, Cluster
from tests.conftest import LOG_DIR
from tests.integration.fake_nodes import FakeNode
from tests.integration.helm import (  # noqa: F401  (fixtures: a Helm release of the chart)
    chart_crds,
    helm,
    helm_home,
    operator_image,
    release,
)
from tests.integration.jobs import Jobs
from tests.integration.rbac import chart_identity
from tests.support import free_ports, has_failed, wait_for

CRD_DIR = REPO / "crds"
CRD_NAME = "multiworkerjobs.multiworker.dev"
OPERATOR = Path(sys.executable).with_name("multiworker-operator")


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> None:
    """Install the CRD exactly as committed; a missing CRD fails the tier, never skips it."""
    assert list(CRD_DIR.glob("*.yaml")), f"no CRDs in {CRD_DIR}: run `make generate`"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    cluster.wait_established(CRD_NAME)


@dataclass
class OperatorProcess:
    """The real operator, restartable (tests kill it with SIGKILL to test convergence)."""

    env: dict[str, str]
    namespace: str
    log_path: Path
    health_port: int = 0  # 0: two free loopback ports, chosen together
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra: tuple[str, ...] = ()  # more command-line options
    # Stable across restarts, like a pod name: a restarted operator is the same instance and
    # renews its Lease at once instead of waiting for it to expire.
    identity: str = "operator-0"

    def __post_init__(self) -> None:
        if not (self.health_port and self.metrics_port):
            self.health_port, self.metrics_port = free_ports(2)

    def start(self) -> None:
        assert OPERATOR.exists(), f"{OPERATOR} missing: pip install -e 'operator[test]'"
        args = [str(OPERATOR), "--namespace", self.namespace,
                "--health-port", str(self.health_port), "--metrics-port", str(self.metrics_port),
                "--log-level", "debug", "--identity", self.identity, *self.extra]
        with self.log_path.open("ab") as log:
            log.write(f"\n==== starting {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.healthy, 30, describe=lambda: f"a healthy operator\n{self.log_tail()}")

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited {self.proc.returncode}:\n{self.log_tail()}")
        return self.get(self.health_port, "/healthz") is not None

    def get(self, port: int, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return None

    def metrics(self) -> str:
        return self.get(self.metrics_port, "/metrics") or ""

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include `labels` (0 when absent)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            sample, _, value = line.rpartition(" ")
            metric, _, rest = sample.partition("{")
            if metric != name:
                continue
            found = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv)
            if all(found.get(k, "").strip('"') == v for k, v in labels.items()):
                total += float(value)
        return total

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye — the worst case for convergence."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def chart_env(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of an operator that has only the chart's RBAC (rbac.py)."""
    identity = chart_identity(cluster, namespace, tmp_path)
    yield {**cluster.env, "KUBECONFIG": str(identity.kubeconfig)}
    identity.delete(cluster)


@pytest.fixture
def operator(
    namespace: str, crds: None, request: pytest.FixtureRequest, tmp_path: Path,
    chart_env: dict[str, str],
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(env=chart_env, namespace=namespace,
                              log_path=tmp_path / "operator.log")
    process.start()
    yield process
    process.stop()
    if has_failed(request):
        out = LOG_DIR / namespace
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(process.log_path, out / "operator.log")  # its tail is in the report
        print(f"the operator's whole log: {out / 'operator.log'}")


@pytest.fixture
def jobs(cluster: Cluster, namespace: str, crds: None) -> Jobs:
    return Jobs(cluster, namespace)


@pytest.fixture
def fake_node(cluster: Cluster) -> Iterator[FakeNode]:
    """A Ready node with no kubelet (fake_nodes.py), deleted afterwards."""
    node = FakeNode(cluster)
    node.create()
    yield node
    node.delete()
