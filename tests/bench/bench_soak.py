"""Soak: what a long run accumulates, in the trainers and in the operator (not part of CI).

    .venv/bin/python tests/bench/bench_soak.py trainers [--minutes 30] [--mode InPlace]
                                                        [--kill-at 2.5] [--workers 3]
    .venv/bin/python tests/bench/bench_soak.py churn [--jobs 2000] [--wave 200]

Both need the local cluster (make cluster-up) and run the real operator on this host for a
fresh namespace; `trainers` needs the worker image loaded (make images-load), `churn` adds
kwok fake nodes (hack/cluster/fake-nodes.sh) and deletes them at the end.

`trainers`: the CPU example (examples/cpu-job.yaml, its epochs raised so it outlasts the run)
trains for `--minutes`, in `--mode` Recreate or InPlace (with its warm spares), and with
`--kill-at` one SIGKILL of worker-1's trainer that many minutes in. Every 10 s it samples, from
/proc (the local cluster's containers share this kernel), each process of each worker pod —
the trainer, the warm spare, the launcher, the agent sidecar — and the operator: threads,
resident memory and open descriptors. It prints, per process, the value at its start, after
its first minute, at the end, the maximum and the least-squares slope per minute after the
first minute, and calls out any that grows after its first minute (threads by more than 50,
memory by more than 1.2x, descriptors by more than 20), then the restarts the job spent.

`churn`: `--jobs` jobs of 2 workers on fake nodes, `--wave` at a time: created, Running, the
chief "exits 0" (its pod status written as a kubelet would), Succeeded, deleted, gone. After
each wave: the operator's resident memory, threads, descriptors, connections to the API
server and the entries of its tables (multiworker_tracked_entries); at the end each against
its value after the first wave, and what is left in the namespace (pods, ConfigMaps,
Services, Leases, NetworkPolicies, Events).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_in_place import KILL_TRAINER, claim
from tests.bench.bench_in_place import job_manifest as example_job
from tests.bench.bench_scale import fake_nodes
from tests.bench.bench_scale import job_manifest as fake_node_job
from tests.bench.harness import (
    GROUP,
    PLURAL,
    REPO,
    Cluster,
    free_port,
    operator,
)
from tests.chaos.kwok import exit_worker
from tests.chaos.rest import Rest

SAMPLE_SECONDS = 10.0
FIRST_MINUTE = 60.0
# What counts as growing after the first minute.
GROWS = {"threads": lambda first, end: end - first > 50,
         "rss_mb": lambda first, end: end > 1.2 * first,
         "fds": lambda first, end: end - first > 20}
MODES = {"Recreate": "recreate", "InPlace": "warm"}  # bench_in_place's names for them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    trainers = sub.add_parser("trainers", help="the CPU example trains for --minutes")
    trainers.add_argument("--minutes", type=float, default=30)
    trainers.add_argument("--mode", choices=sorted(MODES), default="Recreate")
    trainers.add_argument("--kill-at", type=float, metavar="MINUTES",
                          help="SIGKILL worker-1's trainer this many minutes in")
    trainers.add_argument("--workers", type=int, default=3)
    churn = sub.add_parser("churn", help="thousands of short jobs through the operator")
    churn.add_argument("--jobs", type=int, default=2000)
    churn.add_argument("--wave", type=int, default=200)
    churn.add_argument("--timeout", type=float, default=600, help="per wave step, seconds")
    return parser.parse_args(argv)


# --- what a process holds -----------------------------------------------------------------

def holdings(pid: int) -> dict[str, float] | None:
    """Threads, resident MiB and open descriptors of a live process (None: it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"threads": int(fields["Threads"]), "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
            "fds": fds}


def _ns_pid(pid: str) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1]


def pod_processes(pods: set[str]) -> dict[int, tuple[str, str]]:
    """The host pid of every process of `pods` (by their HOSTNAME) -> (pod, role): trainer,
    spare (the launcher's waiting interpreter), launcher or agent."""
    found: dict[int, tuple[str, str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        pod = next((v[9:].decode() for v in environ if v.startswith(b"HOSTNAME=")), None)
        if pod not in pods or not cmdline.startswith("python"):
            continue
        role = ("agent" if "agent.py" in cmdline else
                "launcher" if "launcher.py" in cmdline else "trainer")
        found[int(entry.name)] = (pod, role, cmdline)
    spares = set()
    for pid, (_, role, _) in found.items():
        if role == "launcher":  # its report names its spare, by the container's pid
            with contextlib.suppress(OSError, ValueError, KeyError):
                report = json.loads(Path(f"/proc/{pid}/root/run/multiworker/launcher.json")
                                    .read_text())
                spares.add(str(report["sparePid"]))
    result = {}
    for pid, (pod, role, _) in found.items():
        with contextlib.suppress(OSError, StopIteration):
            if role == "trainer" and _ns_pid(str(pid)) in spares:
                role = "spare"
        result[pid] = (pod, role)
    return result


@dataclass
class Series:
    """One process's samples: (seconds since the run began, holdings)."""

    name: str
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def at(self, seconds: float) -> dict[str, float]:
        """The first sample `seconds` after this process's first one (else its last)."""
        first = self.samples[0][0]
        return next((h for t, h in self.samples if t - first >= seconds), self.samples[-1][1])

    def slope(self, what: str) -> float:
        """Least-squares change per minute after the first minute (0 with too few samples)."""
        first = self.samples[0][0]
        later = [(t, h[what]) for t, h in self.samples if t - first >= FIRST_MINUTE]
        if len(later) < 3:
            return 0.0
        return statistics.linear_regression([t for t, _ in later],
                                            [v for _, v in later]).slope * 60

    def grows(self) -> list[str]:
        if self.samples[-1][0] - self.samples[0][0] < 2 * FIRST_MINUTE:
            return []
        return [what for what, test in GROWS.items()
                if test(self.at(FIRST_MINUTE)[what], self.samples[-1][1][what])]


def table(series: list[Series]) -> str:
    head = f"{'process':42} {'what':8} {'start':>8} {'1 min':>8} {'end':>8} {'max':>8} " \
           f"{'/min after 1 min':>17}"
    rows = [head]
    for s in series:
        for what in GROWS:
            values = [h[what] for _, h in s.samples]
            rows.append(f"{s.name:42} {what:8} {values[0]:8.0f} {s.at(FIRST_MINUTE)[what]:8.0f} "
                        f"{values[-1]:8.0f} {max(values):8.0f} {s.slope(what):17.2f}")
    return "\n".join(rows)


def callouts(series: list[Series]) -> list[str]:
    return [f"GROWS after its first minute: {s.name} {what} "
            f"{s.at(FIRST_MINUTE)[what]:.0f} -> {s.samples[-1][1][what]:.0f}"
            for s in series for what in s.grows()]


# --- trainers --------------------------------------------------------------------------------

def trainers(args: argparse.Namespace) -> None:
    cluster = Cluster(REPO / ".cluster" / "kubeconfig")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.wait_established(f"{PLURAL}.{GROUP}")
    namespace = f"bench-soak-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    claim(cluster, namespace, tempfile.mkdtemp(prefix="mwj-soak-ckpt-"))
    log = Path(tempfile.mkdtemp(prefix="mwj-soak-")) / "operator.log"
    name = "soak"
    job = example_job(name, args.workers, MODES[args.mode])
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TRAIN_EPOCHS", "value": "1000000"}]
    series: dict[tuple[str, str, int], Series] = {}
    status: dict[str, Any] = {}
    try:
        with operator(cluster, namespace, log) as proc:
            cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(job))
            began = time.monotonic()
            killed = False
            while (elapsed := time.monotonic() - began) < args.minutes * 60:
                if args.kill_at is not None and not killed and elapsed >= args.kill_at * 60:
                    cluster.kubectl("-n", namespace, "exec", f"{name}-worker-1", "-c",
                                    "tensorflow", "--", "sh", "-c", KILL_TRAINER)
                    killed = True
                    print(f"{elapsed:6.0f}s SIGKILL of worker-1's trainer", flush=True)
                pods = {f"{name}-worker-{i}" for i in range(args.workers)}
                targets = {**pod_processes(pods), proc.pid: ("operator", "operator")}
                for pid, (pod, role) in targets.items():
                    held = holdings(pid)
                    if held is not None:
                        key = (pod, role, pid)
                        series.setdefault(key, Series(f"{pod} {role} {pid}")).samples.append(
                            (elapsed, held))
                status = json.loads(cluster.kubectl("-n", namespace, "get", "mwj", name, "-o",
                                                    "jsonpath={.status}", check=False) or "{}")
                step = (status.get("progress") or {}).get("step")
                print(f"{elapsed:6.0f}s {status.get('phase')} step {step} restarts "
                      f"{status.get('restarts', 0)} disruptions {status.get('disruptions', 0)}; "
                      + ", ".join(f"{k[0][-8:]} {k[1]} {s.samples[-1][1]['threads']:.0f}t"
                                  for k, s in sorted(series.items())
                                  if s.samples[-1][0] == elapsed), flush=True)
                time.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - began - elapsed)))
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"bench-{namespace}"[:63], "--wait=false", check=False)
        print(f"operator log: {log}")
    ordered = [series[k] for k in sorted(series, key=lambda k: (k[0], k[1], k[2]))]
    print(f"\n{args.workers} workers of the CPU example, mode {args.mode}, "
          f"{args.minutes:g} min" + (f", SIGKILL at {args.kill_at:g} min" if args.kill_at
                                      is not None else "") + f", sampled every {SAMPLE_SECONDS:g}s")
    print(table(ordered))
    for line in callouts(ordered) or ["nothing grows after its first minute"]:
        print(line)
    print("known and bounded: a trainer gains a little with each checkpoint, not with steps: "
          "TensorFlow's Checkpoint.write globs '<prefix>*' and Python's fnmatch cache keeps each "
          "new pattern (at most 32,768, ~0.7 KB each); the example checkpoints every 15-step "
          "epoch, so here that shows (docs/benchmarks.md#long-runs)")
    print(f"job: {status.get('phase')}, step {(status.get('progress') or {}).get('step')}, "
          f"restarts {status.get('restarts', 0)}, disruptions {status.get('disruptions', 0)}, "
          f"generation {status.get('groupGeneration', 0)}")


# --- churn -----------------------------------------------------------------------------------

def scrape_tables(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^multiworker_tracked_entries\{table="([^"]+)"\} (\S+)$', text,
                        re.MULTILINE)}


def api_connections(pid: int, api_port: int) -> int:
    """The process's TCP connections to the API server's port (its watches and its pool)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table_path in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table_path).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[2].rsplit(":", 1)[1], 16) == api_port and cols[9] in inodes:
                    count += 1
    return count


def wait_until(what: str, done: Callable[[], bool], timeout: float) -> float:
    began = time.monotonic()
    while not done():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not after {timeout:g}s")
        time.sleep(0.5)
    return time.monotonic() - began


def churn(args: argparse.Namespace) -> None:
    cluster = Cluster(REPO / ".cluster" / "kubeconfig")
    rest = Rest(cluster.core.api_client)
    api_port = int(re.search(r"server: https://[^:]+:(\d+)",
                             (REPO / ".cluster" / "kubeconfig").read_text())[1])  # type: ignore[index]
    namespace = f"bench-churn-{uuid.uuid4().hex[:5]}"
    workers, gpus = 2, 8
    fake_nodes(cluster, str(-(-args.wave * workers // gpus)), str(gpus))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.wait_established(f"{PLURAL}.{GROUP}")
    cluster.kubectl("create", "namespace", namespace)
    log = Path(tempfile.mkdtemp(prefix="mwj-churn-")) / "operator.log"
    port = free_port()
    rows: list[dict[str, Any]] = []

    def phases() -> list[str]:
        out = cluster.kubectl("-n", namespace, "get", "mwj", "-o",
                              "jsonpath={range .items[*]}{.status.phase}{'\\n'}{end}")
        return out.split()

    def every_job(phase: str, count: int) -> Callable[[], bool]:
        return lambda: phases().count(phase) == count

    def pods_left() -> int:
        return len(cluster.kubectl("-n", namespace, "get", "pods", "-o", "name").split())

    try:
        with operator(cluster, namespace, log, "--metrics-port", str(port),
                      ready_timeout=60) as proc:
            done = 0
            while done < args.jobs:
                size = min(args.wave, args.jobs - done)
                names = [f"c{done + i:05d}" for i in range(size)]
                began = time.monotonic()
                items = []
                for name in names:
                    item = fake_node_job(name, workers)
                    item["metadata"]["namespace"] = namespace
                    items.append(item)
                cluster.kubectl("apply", "-f", "-", stdin=json.dumps(
                    {"apiVersion": "v1", "kind": "List", "items": items}))
                wait_until("all Running", every_job("Running", size), args.timeout)
                for name in names:
                    exit_worker(rest, namespace, f"{name}-worker-0", 0)
                wait_until("all Succeeded", every_job("Succeeded", size), args.timeout)
                cluster.kubectl("-n", namespace, "delete", "mwj", "--all", "--wait=false")
                wait_until("jobs and pods gone", lambda: not phases() and not pods_left(),
                           args.timeout)
                done += size
                time.sleep(SAMPLE_SECONDS)  # the operator's last passes and forgets
                held = holdings(proc.pid) or {}
                row = {"jobs": done, "seconds": time.monotonic() - began, **held,
                       "api": api_connections(proc.pid, api_port), "tables": scrape_tables(port)}
                rows.append(row)
                busy = {k: v for k, v in row["tables"].items() if v and k != "nodes"}
                print(f"{done:6d} jobs: wave {row['seconds']:.0f}s, rss "
                      f"{held.get('rss_mb', 0):.0f} MiB, {held.get('threads', 0):.0f} threads, "
                      f"{held.get('fds', 0):.0f} fds, {row['api']} API connections; tables "
                      f"not empty: {busy or 'none'}", flush=True)
            left = {kind: cluster.kubectl("-n", namespace, "get", kind, "-o", "name").split()
                    for kind in ("pods", "configmaps", "services", "leases", "networkpolicies",
                                 "events")}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        fake_nodes(cluster, "--delete")
        print(f"operator log: {log}")
    first, last = rows[0], rows[-1]
    print(f"\noperator under churn: {last['jobs']} jobs of {workers} workers on fake nodes, "
          f"{args.wave} a wave")
    print(f"{'':24} {'after wave 1':>13} {'end':>8} {'end/wave 1':>11}")
    for what in ("rss_mb", "threads", "fds", "api"):
        print(f"{what:24} {first[what]:13.0f} {last[what]:8.0f} "
              f"{last[what] / first[what] if first[what] else float('nan'):11.2f}")
    for table_name in sorted(last["tables"]):
        print(f"table {table_name:18} {first['tables'][table_name]:13.0f} "
              f"{last['tables'][table_name]:8.0f}")
    print("left in the namespace: " + ", ".join(
        f"{kind} {len(names)}" + (f" ({', '.join(n.split('/')[-1] for n in names)})"
                                  if kind in ("configmaps", "leases") else "")
        for kind, names in left.items()) +
          "\n(kube-root-ca.crt is Kubernetes'; the Lease is the running operator's leadership "
          "of the namespace; Events expire after their TTL, 1 h by default)")


def main() -> None:
    args = parse_args()
    (trainers if args.part == "trainers" else churn)(args)


if __name__ == "__main__":
    main()
