"""What the benchmarks share: commands and reads against the cluster, operator processes.

Polling comes from the suite (tests/support.py). The benchmarks run as scripts from the repo
root; each puts the root on sys.path before importing this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.support import free_port, wait_for

__all__ = ["BIN", "CLUSTER_LOCK", "GROUP", "IMAGE", "JOB_LABEL", "OPERATOR", "PLURAL", "REPO",
           "VERSION", "Cluster", "Obj", "cluster_lock", "cpu_seconds", "free_port", "http_ok",
           "operator", "process", "rss_bytes", "wait_for"]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MW_CACHE", Path.home() / ".cache" / "multiworker")) / "bin"
OPERATOR = Path(sys.executable).with_name("multiworker-operator")
GROUP, VERSION, PLURAL = "multiworker.dev", "v1alpha1", "multiworkerjobs"
IMAGE = "multiworker.local/base:bookworm"
JOB_LABEL = "multiworker.dev/job-name"
Obj = dict[str, Any]


class Cluster:
    """Commands (output captured) and API reads against one cluster."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.env = dict(os.environ, KUBECONFIG=str(kubeconfig),
                        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def run(self, *cmd: str | Path, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run([str(c) for c in cmd], input=stdin, capture_output=True,
                              text=True, env=self.env, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n"
                               f"{proc.stderr}{proc.stdout}")
        return proc.stdout

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.run(shutil.which("kubectl", path=self.env["PATH"]) or "kubectl", *args,
                        stdin=stdin, check=check)

    def wait_established(self, crd: str) -> None:
        """Wait until the API server serves `crd` (`kubectl wait` fails while it has no status)."""
        query = '{.status.conditions[?(@.type=="Established")].status}'
        wait_for(lambda: self.kubectl("get", "crd", crd, "-o", f"jsonpath={query}",
                                      check=False) == "True", 60, 0.2, f"CRD {crd} established")

    def job_status(self, namespace: str, name: str) -> Obj:
        job: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
        return dict(job.get("status") or {})

    def pods_gone(self, namespace: str, name: str) -> bool:
        response: Any = self.core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}={name}", _preload_content=False)
        return not json.loads(response.data)["items"]


@contextlib.contextmanager
def process(cmd: list[str], env: dict[str, str], log: Path, ready: Callable[[], bool],
            ready_timeout: float = 60) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` as a subprocess (output appended to `log`) once `ready()`; stopped on the way out
    (SIGTERM, then SIGKILL after 15 s)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{Path(cmd[0]).name} exited {proc.returncode}; see {log}")
            return ready()

        wait_for(up, ready_timeout, interval=0.1, describe=f"{Path(cmd[0]).name} ready")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_ok(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1):
        return True
    return False


@contextlib.contextmanager
def operator(cluster: Cluster, namespace: str, log: Path, *options: str,
             ready_timeout: float = 30) -> Iterator[subprocess.Popen[bytes]]:
    """The real operator for `namespace` with extra command-line `options`, as the integration
    tier runs it; stopped (SIGTERM, then SIGKILL) on the way out."""
    health = free_port()
    cmd = [str(OPERATOR), "--identity", "bench", "--namespace", namespace,
           "--health-port", str(health), *options]
    with process(cmd, cluster.env, log, lambda: http_ok(f"http://127.0.0.1:{health}/healthz"),
                 ready_timeout) as proc:
        yield proc


CLUSTER_LOCK = "/tmp/mw-cluster.lock"


@contextlib.contextmanager
def cluster_lock(path: str = CLUSTER_LOCK, hold: bool = True) -> Iterator[None]:
    """Hold the local cluster's lock (flock on `path`) for the block: benchmarks, chaos runs and
    `make test` share one cluster, and a benchmark that ends deletes every fake node. `hold`
    False: the caller holds it already."""
    if not hold:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, all its threads (ended ones included), to the
    nanosecond: the process's CPU clock (Linux encodes the clock id of another process as glibc's
    clock_getcpuclockid does). /proc's count of 10 ms ticks is the fallback; at 8 workers one
    tick is 0.6 ms per pod."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of process `pid`
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
