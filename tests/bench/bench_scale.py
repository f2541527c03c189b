"""Scale benchmark: how long the operator takes to start a group of N workers, and to restart
the whole group after one worker pod is deleted, on kwok fake nodes (not part of CI).

    .venv/bin/python tests/bench/bench_scale.py [--workers 16,64,256] [--reps 3]

Needs the local cluster (make cluster-up). It adds fake nodes (hack/cluster/fake-nodes.sh,
--gpus each, enough for the largest size), applies the CRD from crds/, runs the real operator
(.venv/bin/multiworker-operator) as a subprocess for a fresh namespace, and for each size and
repetition applies a MultiWorkerJob whose pods only fit on fake nodes (one nvidia.com/gpu each),
measures, and deletes it. At the end it deletes the namespace and the fake nodes and stops the
operator, and prints a table of medians:

- start: apply -> status phase Running, ready N/N (generation 0), seen by polling every 0.1 s;
- restart: delete one worker pod (a disruption) -> generation 1 Running, ready N/N;
- lastRecoverySeconds: the operator's own measure of that restart (failure seen -> running);
- op CPU: CPU seconds the operator process spent on one start + restart.

Nothing runs in the pods: kwok reports them Running with IPs (from its --cidr) that have
nothing behind them, so the operator's progress polls (podIP:8471) never get a report. How long
such a poll takes depends on the host: answered or refused at once, or, where the packets are
dropped, the whole probe timeout (2 s), which a pass woken meanwhile waits out too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MW_CACHE", Path.home() / ".cache" / "multiworker")) / "bin"
GROUP, VERSION, PLURAL = "multiworker.dev", "v1alpha1", "multiworkerjobs"
IMAGE = "multiworker.local/base:bookworm"  # never pulled or run: fake nodes only
JOB_LABEL = "multiworker.dev/job-name"
POLL_SECONDS = 0.1
T = TypeVar("T")
Obj = dict[str, Any]


@dataclass(frozen=True)
class Sample:
    start: float  # seconds, apply -> all running
    restart: float  # seconds, pod deleted -> next generation all running
    last_recovery: float | None  # status.lastRecoverySeconds after the restart
    operator_cpu: float  # operator CPU seconds for the start and the restart


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="16,64,256",
                        help="comma-separated group sizes (default 16,64,256)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per size (default 3)")
    parser.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per fake node")
    parser.add_argument("--timeout", type=float, default=300,
                        help="give up on one measurement after this many seconds")
    args = parser.parse_args(argv)
    args.sizes = [int(n) for n in args.workers.split(",") if n.strip()]
    if not args.sizes or min(args.sizes) < 1 or max(args.sizes) > 1024 or args.reps < 1:
        parser.error("--workers takes sizes from 1 to 1024, --reps at least 1")
    return args


def wait_for(what: str, check: Callable[[], T | None], timeout: float) -> T:
    """Poll `check` until it returns something other than None or False."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_SECONDS)


class Cluster:
    """kubectl, the fake-nodes script and API reads against the local cluster."""

    def __init__(self, kubeconfig: Path) -> None:
        self.env = dict(os.environ, KUBECONFIG=str(kubeconfig),
                        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def run(self, *cmd: str | Path, stdin: str | None = None) -> str:
        proc = subprocess.run([str(c) for c in cmd], input=stdin, capture_output=True,
                              text=True, env=self.env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n"
                               f"{proc.stderr}{proc.stdout}")
        return proc.stdout

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.run(shutil.which("kubectl", path=self.env["PATH"]) or "kubectl", *args,
                        stdin=stdin)

    def fake_nodes(self, *args: str) -> None:
        self.run(REPO / "hack/cluster/fake-nodes.sh", *args)

    def job_status(self, namespace: str, name: str) -> Obj:
        job: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
        return dict(job.get("status") or {})

    def job_pods(self, namespace: str, name: str) -> list[Obj]:
        response: Any = self.core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}={name}", _preload_content=False)
        items: list[Obj] = json.loads(response.data)["items"]
        return items


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def operator(cluster: Cluster, namespace: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The real operator for `namespace`, stopped (SIGTERM, then SIGKILL) on the way out."""
    health, metrics = free_port(), free_port()
    cmd = [str(REPO / ".venv/bin/multiworker-operator"), "--standalone", "--namespace",
           namespace, "--health-port", str(health), "--metrics-port", str(metrics)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=cluster.env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the operator exited {proc.returncode}; see {log}")
            url = f"http://127.0.0.1:{health}/healthz"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1):
                return True
            return False
        wait_for("the operator's /healthz", healthy, 60)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def job_manifest(name: str, workers: int) -> Obj:
    container = {
        "name": "tensorflow",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", "infinity"],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    pod_spec = {
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "multiworker.dev/fake-node", "operator": "Exists",
                         "effect": "NoSchedule"}],
        "containers": [container],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {"workers": workers, "template": {"spec": pod_spec}},
    }


def all_running(status: Obj, workers: int, generation: int) -> bool:
    return (status.get("phase") == "Running" and status.get("ready") == f"{workers}/{workers}"
            and status.get("groupGeneration", 0) == generation)


def measure(cluster: Cluster, ns: str, pid: int, name: str, workers: int,
            timeout: float) -> Sample:
    """One job: apply, wait until running; delete a worker pod, wait until the next
    generation runs; delete the job and wait until its pods are gone."""
    cpu0 = cpu_seconds(pid)
    applied = time.monotonic()
    cluster.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(job_manifest(name, workers)))
    wait_for(f"{name}: {workers} workers running",
             lambda: all_running(cluster.job_status(ns, name), workers, 0), timeout)
    started = time.monotonic()

    victim = f"{name}-worker-{workers // 2}"
    cluster.core.delete_namespaced_pod(victim, ns)
    deleted = time.monotonic()
    def restarted_status() -> Obj | None:
        status = cluster.job_status(ns, name)
        return status if all_running(status, workers, 1) else None

    status = wait_for(f"{name}: generation 1 running after deleting {victim}",
                      restarted_status, timeout)
    restarted = time.monotonic()
    cpu1 = cpu_seconds(pid)

    cluster.kubectl("-n", ns, "delete", "mwj", name, "--wait=true")
    wait_for(f"{name}: pods deleted", lambda: not cluster.job_pods(ns, name), timeout)
    return Sample(start=started - applied, restart=restarted - deleted,
                  last_recovery=status.get("lastRecoverySeconds"), operator_cpu=cpu1 - cpu0)


def median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f}" if known else "-"


def table(results: dict[int, list[Sample]]) -> str:
    head = ("workers", "reps", "start s", "restart s", "lastRecoverySeconds", "op CPU s")
    rows = [head] + [
        (str(n), str(len(s)), median([x.start for x in s]), median([x.restart for x in s]),
         median([x.last_recovery for x in s]), median([x.operator_cpu for x in s]))
        for n, s in results.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[int, list[Sample]]:
    cluster = Cluster(Path(os.environ.get("KUBECONFIG", REPO / ".cluster/kubeconfig")))
    ns = f"mw-bench-{uuid.uuid4().hex[:6]}"
    logs = Path(tempfile.mkdtemp(prefix="mw-bench-"))
    nodes = math.ceil(max(args.sizes) / args.gpus)
    results: dict[int, list[Sample]] = {}
    print(f"{nodes} fake nodes x {args.gpus} GPUs; namespace {ns}; operator log in {logs}",
          file=sys.stderr)
    try:
        cluster.fake_nodes(str(nodes), str(args.gpus))
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        f"crd/{PLURAL}.{GROUP}")
        cluster.kubectl("create", "namespace", ns)
        with operator(cluster, ns, logs / "operator.log") as proc:
            for n in args.sizes:
                for rep in range(args.reps):
                    sample = measure(cluster, ns, proc.pid, f"bench-{n}-{rep}", n, args.timeout)
                    results.setdefault(n, []).append(sample)
                    print(f"  {n:4d} workers, rep {rep}: start {sample.start:.2f}s, "
                          f"restart {sample.restart:.2f}s (lastRecoverySeconds "
                          f"{sample.last_recovery}), operator CPU {sample.operator_cpu:.2f}s",
                          file=sys.stderr)
    except (TimeoutError, RuntimeError) as e:  # keep what was measured; say where it stopped
        print(f"stopped early: {e}", file=sys.stderr)
    finally:
        with contextlib.suppress(RuntimeError):
            cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true",
                            "--timeout=120s")
        cluster.fake_nodes("--delete")
    return results


def main(argv: list[str] | None = None) -> None:
    results = run(parse_args(argv))
    print(table(results))


if __name__ == "__main__":
    main()
