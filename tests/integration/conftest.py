"""Integration tier: the CRD from crds/ on a real API server, and the real operator process.

`operator` starts `multiworker-operator --standalone --namespace <test namespace>` as a
subprocess (so each test has its own operator watching only its own namespace), waits for its
health endpoint, and saves its log to test-logs/<namespace>/operator.log when the test fails.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster import REPO, Cluster
from tests.integration.jobs import Jobs
from tests.support import wait_for

CRD_DIR = REPO / "crds"
CRD_NAME = "multiworkerjobs.multiworker.dev"
LOG_DIR = REPO / "test-logs"
OPERATOR = Path(sys.executable).with_name("multiworker-operator")


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> None:
    """Install the CRD exactly as committed; a missing CRD fails the tier, never skips it."""
    assert list(CRD_DIR.glob("*.yaml")), f"no CRDs in {CRD_DIR}: run `make generate`"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    """The real operator, restartable (tests kill it with SIGKILL to test convergence)."""

    env: dict[str, str]
    namespace: str
    log_path: Path
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert OPERATOR.exists(), f"{OPERATOR} missing: pip install -e 'operator[test]'"
        args = [str(OPERATOR), "--standalone", "--namespace", self.namespace,
                "--health-port", str(self.health_port), "--metrics-port", str(self.metrics_port),
                "--log-level", "debug"]
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
def operator(
    cluster: Cluster, namespace: str, crds: None, request: pytest.FixtureRequest,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(env=cluster.env, namespace=namespace,
                              log_path=tmp_path / "operator.log")
    process.start()
    yield process
    process.stop()
    failed = any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False)
                 for w in ("setup", "call"))
    if failed:
        out = LOG_DIR / namespace
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(process.log_path, out / "operator.log")
        print(f"---- operator log (tail; full log in {out / 'operator.log'}) ----")
        print(process.log_tail(200))


@pytest.fixture
def jobs(cluster: Cluster, namespace: str, crds: None) -> Jobs:
    return Jobs(cluster, namespace)
