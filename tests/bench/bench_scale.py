"""Scale benchmark: how long the operator takes to start a group of N workers, and to restart
the whole group after one worker pod is deleted, on kwok fake nodes (not part of CI).

    .venv/bin/python tests/bench/bench_scale.py [--workers 8,64,256,1024] [--reps 3]

Needs the local cluster (make cluster-up, or the control plane alone: hack/cluster/up.sh
--no-node) and holds its lock (/tmp/mw-cluster.lock; --no-lock
when the caller holds it). It adds fake nodes (hack/cluster/fake-nodes.sh,
--gpus each, enough for the largest size), applies the CRD from crds/, runs the real operator
(.venv/bin/multiworker-operator) as a subprocess for a fresh namespace, and for each size and
repetition applies a MultiWorkerJob whose pods only fit on fake nodes (one nvidia.com/gpu each),
measures, and deletes it (one job of the smallest size goes first, unmeasured, so that no
figure carries the fresh process's first connections). At the end it deletes the namespace and
the fake nodes and stops the operator, and prints a table of medians:

- start: apply -> status phase Running, ready N/N (generation 0), seen by polling every 0.1 s;
- restart: delete one worker pod (a disruption) -> generation 1 Running, ready N/N;
- lastRecoverySeconds: the operator's own measure of that restart (failure seen -> running);
- op CPU: CPU seconds the operator process spent on one start + restart, from apply until the
  job's pods are all gone again (so the deletions are counted in);
- CPU/pod: that divided by the pods one start + restart creates (2 x workers), in ms; CPU
  seconds do not depend on how many cores the machine has, so this is the figure to compare
  across machines and sizes (the table ends with its ratio between the largest and 64 workers);
- watch KB/pod: bytes of pod watch events the operator received per pod created;
- passes: reconcile passes run over those events;
- a second table: that CPU per pod by the operator's thread (informer threads, the API loop
  that sends the batches, the event loop, the pass workers; names from `py-spy dump` where
  py-spy is installed), from the scheduler's count per thread. A sampling profile run against
  a busy 2-core machine overstates threads preempted while they hold the GIL; that count does not.

With --profile FILE, py-spy (pip install py-spy) samples the operator during the largest size's
repetitions and the top functions by inclusive time are printed (collapsed stacks in FILE).

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
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# As a script only tests/bench/ is on sys.path; the imports below need the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness import (
    CLUSTER_LOCK,
    GROUP,
    IMAGE,
    PLURAL,
    REPO,
    VERSION,
    Cluster,
    Obj,
    cluster_lock,
    cpu_seconds,
    free_port,
    operator,
    wait_for,
)
from tests.bench.identity import scrape_sum

POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Sample:
    workers: int
    start: float  # seconds, apply -> all running
    restart: float  # seconds, pod deleted -> next generation all running
    last_recovery: float | None  # status.lastRecoverySeconds after the restart
    operator_cpu: float  # operator CPU seconds for the start, the restart and the deletion
    watch_bytes: float | None  # bytes of pod watch events meanwhile
    passes: float | None  # reconcile passes meanwhile
    requests: dict[str, float] | None = None  # API requests meanwhile, by "verb resource"
    threads: dict[str, float] | None = None  # operator CPU seconds meanwhile, by thread

    @property
    def cpu_per_pod(self) -> float:
        """Seconds of operator CPU per pod created (a start and a restart: 2 x workers)."""
        return self.operator_cpu / (2 * self.workers)


@dataclass(frozen=True)
class Counters:
    """What the operator's /metrics says of its work so far."""

    watch_bytes: float | None
    passes: float | None
    requests: dict[str, float] | None

    @classmethod
    def read(cls, port: int) -> Counters:
        return cls(scrape_sum(port, ("multiworker_watch_bytes_total",), 'resource="pods"'),
                   scrape_sum(port, ("multiworker_reconcile_seconds_count",)),
                   scrape_requests(port))

    def since(self, earlier: Counters) -> Counters:
        def delta(a: float | None, b: float | None) -> float | None:
            return a - b if a is not None and b is not None else None
        requests = None
        if self.requests is not None and earlier.requests is not None:
            requests = {k: n - earlier.requests.get(k, 0) for k, n in self.requests.items()
                        if n > earlier.requests.get(k, 0)}
        return Counters(delta(self.watch_bytes, earlier.watch_bytes),
                        delta(self.passes, earlier.passes), requests)


def scrape_requests(port: int) -> dict[str, float] | None:
    """The operator's API requests so far, by "verb resource" (all HTTP codes together)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "multiworker_api_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    kind = f"{sample.labels['verb']} {sample.labels['resource']}"
                    counts[kind] = counts.get(kind, 0.0) + sample.value
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="8,64,256",
                        help="comma-separated group sizes (default 8,64,256)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per size (default 3)")
    parser.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per fake node")
    parser.add_argument("--timeout", type=float, default=300,
                        help="give up on one measurement after this many seconds")
    parser.add_argument("--no-lock", action="store_true",
                        help=f"the caller holds the cluster lock ({CLUSTER_LOCK})")
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy the operator during the largest size's repetitions; "
                             "collapsed stacks go to this file")
    args = parser.parse_args(argv)
    args.sizes = [int(n) for n in args.workers.split(",") if n.strip()]
    if not args.sizes or min(args.sizes) < 1 or max(args.sizes) > 1024 or args.reps < 1:
        parser.error("--workers takes sizes from 1 to 1024, --reps at least 1")
    return args


def fake_nodes(cluster: Cluster, *args: str) -> None:
    cluster.run(REPO / "hack/cluster/fake-nodes.sh", *args)


def job_manifest(name: str, workers: int) -> Obj:
    container = {
        "name": "tensorflow",
        "image": IMAGE,  # never pulled or run: fake nodes only
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


def measure(cluster: Cluster, ns: str, pid: int, metrics_port: int, name: str, workers: int,
            timeout: float) -> Sample:
    """One job: apply, wait until running; delete a worker pod, wait until the next
    generation runs; delete the job and wait until its pods are gone."""
    counters0 = Counters.read(metrics_port)
    threads0 = thread_cpu(pid)
    cpu0 = cpu_seconds(pid)
    applied = time.monotonic()
    cluster.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(job_manifest(name, workers)))
    wait_for(lambda: all_running(cluster.job_status(ns, name), workers, 0), timeout,
             POLL_SECONDS, f"{name}: {workers} workers running")
    started = time.monotonic()

    victim = f"{name}-worker-{workers // 2}"
    cluster.core.delete_namespaced_pod(victim, ns)
    deleted = time.monotonic()
    def restarted_status() -> Obj | None:
        status = cluster.job_status(ns, name)
        return status if all_running(status, workers, 1) else None

    status = wait_for(restarted_status, timeout, POLL_SECONDS,
                      f"{name}: generation 1 running after deleting {victim}")
    restarted = time.monotonic()

    cluster.kubectl("-n", ns, "delete", "mwj", name, "--wait=true")
    wait_for(lambda: cluster.pods_gone(ns, name), timeout, POLL_SECONDS, f"{name}: pods deleted")
    time.sleep(1)  # the last deletions' events reach the operator
    cpu1 = cpu_seconds(pid)
    threads1 = thread_cpu(pid)
    counted = Counters.read(metrics_port).since(counters0)
    return Sample(workers=workers, start=started - applied, restart=restarted - deleted,
                  last_recovery=status.get("lastRecoverySeconds"), operator_cpu=cpu1 - cpu0,
                  watch_bytes=counted.watch_bytes, passes=counted.passes,
                  requests=counted.requests, threads=by_thread(pid, threads0, threads1))


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of `pid` so far: the scheduler's count in nanoseconds
    (/proc/.../schedstat; another process's thread CPU clock cannot be read), else /proc's
    10 ms ticks."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            try:
                seconds[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
            except OSError:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                seconds[int(task.name)] = ((int(fields[11]) + int(fields[12]))
                                           / os.sysconf("SC_CLK_TCK"))
    return seconds


def by_thread(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds spent between two thread_cpu readings, by thread kind; threads that ended
    meanwhile are in no row (the process total has them)."""
    names = thread_names(pid)
    spent: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, f"thread {tid}")
        name = re.sub(r"^informer /.*/", "informer ", name)  # informer /api/v1/.../pods
        name = re.sub(r"^(asyncio|uvloop)_\d+$", "passes (the loop's executor)", name)
        spent[name] = spent.get(name, 0.0) + seconds - before.get(tid, 0.0)
    return spent


def thread_names(pid: int) -> dict[int, str]:
    """Python's names of the threads of `pid`, by native id (`py-spy dump`; {} without it)."""
    beside = Path(sys.executable).with_name("py-spy")
    try:
        dump = subprocess.run([str(beside) if beside.exists() else "py-spy", "dump", "--pid",
                               str(pid), "--nonblocking"], capture_output=True, text=True,
                              timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) \(\w+\): "(.*)"$', dump,
                                                         re.MULTILINE)}


def median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f}" if known else "-"


def per_pod(values: list[float | None], workers: int, scale: float) -> list[float | None]:
    return [v * scale / (2 * workers) if v is not None else None for v in values]


def table(results: dict[int, list[Sample]]) -> str:
    head = ("workers", "reps", "start s", "restart s", "lastRecoverySeconds", "op CPU s",
            "CPU/pod ms", "watch KB/pod", "requests/pod", "passes")
    rows = [head] + [
        (str(n), str(len(s)), median([x.start for x in s]), median([x.restart for x in s]),
         median([x.last_recovery for x in s]), median([x.operator_cpu for x in s]),
         median([x.cpu_per_pod * 1000 for x in s]),
         median(per_pod([x.watch_bytes for x in s], n, 1 / 1024)),
         median(per_pod([sum(x.requests.values()) if x.requests is not None else None
                          for x in s], n, 1)),
         median([x.passes for x in s]))
        for n, s in results.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    largest = max(results, default=0)
    if 64 in results and largest > 64:
        ratio = (statistics.median(x.cpu_per_pod for x in results[largest])
                 / statistics.median(x.cpu_per_pod for x in results[64]))
        lines.append(f"CPU per pod, {largest} : 64 workers = {ratio:.2f}")
    return "\n".join(lines + ["", requests_table(results), "", threads_table(results)])


def threads_table(results: dict[int, list[Sample]]) -> str:
    """Operator CPU per pod created, in ms, by thread (medians; rows under 0.01 ms left out)."""
    def per_pod(kind: str, samples: list[Sample]) -> float:
        return statistics.median((x.threads or {}).get(kind, 0.0) * 1000 / (2 * x.workers)
                                 for x in samples)
    kinds = {k for s in results.values() for x in s for k in (x.threads or {})}
    order = sorted(kinds, key=lambda k: -max(per_pod(k, s) for s in results.values()))
    head = ("CPU per pod, ms, by thread", *(f"{n} workers" for n in results))
    rows = [head] + [(k, *(f"{per_pod(k, s):.2f}" for s in results.values())) for k in order
                     if max(per_pod(k, s) for s in results.values()) >= 0.01]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def requests_table(results: dict[int, list[Sample]]) -> str:
    """API requests of one start + restart + deletion by verb and resource (medians)."""
    kinds = sorted({k for s in results.values() for x in s for k in (x.requests or {})})
    head = ("requests", *(f"{n} workers" for n in results))
    rows = [head] + [(kind, *(median([(x.requests or {}).get(kind, 0) for x in s])
                              for s in results.values())) for kind in kinds]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
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
        fake_nodes(cluster, str(nodes), str(args.gpus))
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        cluster.kubectl("create", "namespace", ns)
        metrics_port = free_port()
        with operator(cluster, ns, logs / "operator.log", "--metrics-port", str(metrics_port),
                      *os.environ.get("MW_BENCH_OPERATOR_ARGS", "").split(),
                      ready_timeout=60) as proc:
            # Unmeasured: a fresh process's first job also pays its first connections, TLS
            # handshakes and lazy imports, which would land on the first size's first rep.
            measure(cluster, ns, proc.pid, metrics_port, "bench-warmup", min(args.sizes),
                    args.timeout)
            for n in args.sizes:
                profiling = args.profile is not None and n == max(args.sizes)
                with sampling(proc.pid, args.profile) if profiling else contextlib.nullcontext():
                    for rep in range(args.reps):
                        sample = measure(cluster, ns, proc.pid, metrics_port,
                                         f"bench-{n}-{rep}", n, args.timeout)
                        results.setdefault(n, []).append(sample)
                        print(f"  {n:4d} workers, rep {rep}: start {sample.start:.2f}s, "
                              f"restart {sample.restart:.2f}s (lastRecoverySeconds "
                              f"{sample.last_recovery}), operator CPU "
                              f"{sample.operator_cpu:.2f}s ({sample.cpu_per_pod * 1000:.2f} ms "
                              f"per pod), {sample.passes} passes", file=sys.stderr)
    except (AssertionError, RuntimeError) as e:  # keep what was measured; say where it stopped
        print(f"stopped early: {e}", file=sys.stderr)
    finally:
        with contextlib.suppress(RuntimeError):
            cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true",
                            "--timeout=120s")
        fake_nodes(cluster, "--delete")
    return results


@contextlib.contextmanager
def sampling(pid: int, out: Path) -> Iterator[None]:
    """py-spy samples the thread of `pid` that holds the GIL — where its Python CPU goes;
    passes and informers run in threads, which cProfile would miss — until the block ends;
    then the top functions are printed."""
    beside = Path(sys.executable).with_name("py-spy")  # in the venv, else on PATH
    spy = subprocess.Popen([str(beside) if beside.exists() else "py-spy", "record",
                            "--pid", str(pid), "--format", "raw", "--rate", "200", "--gil",
                            "--nonblocking", "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        print(top_functions(out.read_text()), file=sys.stderr)


def top_functions(collapsed: str, count: int = 25) -> str:
    """Functions by inclusive share of the samples (a function counted once per stack)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        # "function (file.py:line)": one entry per function, whatever line it was at.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")
                  if not f.startswith(("thread ", "process "))]
        total += int(n)
        for frame in set(frames):
            inclusive[frame] += int(n)
        if frames:
            own[frames[-1]] += int(n)
    rows = [f"{inclusive[f] * 100 / total:6.1f}% {own[f] * 100 / total:6.1f}%  {f}"
            for f, _ in inclusive.most_common(count)]
    return "\n".join([f"{total} samples; inclusive, own, function", *rows])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with cluster_lock(hold=not args.no_lock):  # its end deletes every fake node
        results = run(args)
    print(table(results))


if __name__ == "__main__":
    main()
