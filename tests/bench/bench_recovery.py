"""Recovery benchmark: how fast the operator restarts a group after one worker fails, on the
local real cluster with real pods (not part of CI).

    .venv/bin/python tests/bench/bench_recovery.py [--reps 5] [--workers 3]

Needs the local cluster (make cluster-up) and the base image (built and loaded here, cached).
Applies the CRD from crds/, runs the real operator (.venv/bin/multiworker-operator) for a fresh
namespace, and per repetition applies a job of `--workers` pods from the base image (a shell
that waits; terminationGracePeriodSeconds 1, backoffSeconds 0), waits until it runs, makes
worker 1 exit 1 (`kubectl exec ... sh -c 'kill -USR1 1'`), and follows the job's pods with a watch,
timing every change as this process sees it:

- seen: worker 1's container reported terminated in the API (the failure is observable);
- delete: the first pod of the failed generation marked for deletion (the operator acted);
- gone: the last pod of the failed generation removed (pod termination, grace period 1 s);
- create: the first pod of the next generation created (the operator acted again);
- running: every pod of the next generation running.

Operator-side time is (seen -> delete) + (gone -> create): what the operator adds on top of
pod termination and start-up. Also reported: status.lastRecoverySeconds, the operator's own
measure (failure observed -> new group running). Prints one row per run and the medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import watch

# As a script only tests/bench/ is on sys.path; the imports below need the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness import (
    GROUP,
    IMAGE,
    JOB_LABEL,
    REPO,
    VERSION,
    Cluster,
    Obj,
    operator,
    wait_for,
)

POLL_SECONDS = 0.05
GENERATION_LABEL = "multiworker.dev/group-generation"
INDEX_LABEL = "multiworker.dev/worker-index"
FAILING_WORKER = 1
# PID 1 of the container: exits 1 on USR1 (the failure we inject), 143 on TERM (tear-down).
SCRIPT = textwrap.dedent("""
    trap 'exit 1' USR1
    trap 'exit 143' TERM
    while true; do sleep 1 & wait $!; done
""").strip()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--workers", type=int, default=3, help="workers per job (default 3)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="give up on one measurement after this many seconds")
    args = parser.parse_args(argv)
    if args.reps < 1 or not 2 <= args.workers <= 64:
        parser.error("--reps at least 1, --workers from 2 to 64")
    return args


# --- one measurement ---


@dataclass
class Timeline:
    """When this process saw each change of the job's pods (time.monotonic())."""

    events: list[tuple[float, str, Obj]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def follow(self, cluster: Cluster, namespace: str, job: str, stop: threading.Event) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for event in w.stream(  # type: ignore[no-untyped-call]
                cluster.core.list_namespaced_pod, namespace,
                              label_selector=f"{JOB_LABEL}={job}", timeout_seconds=600):
            seen = time.monotonic()
            raw = event["raw_object"]
            with self.lock:
                self.events.append((seen, event["type"], raw))
            if stop.is_set():
                w.stop()  # type: ignore[no-untyped-call]
                return

    def first(self, what: Callable[[str, Obj], bool]) -> float | None:
        with self.lock:
            return next((t for t, kind, pod in self.events if what(kind, pod)), None)

    def last(self, what: Callable[[str, Obj], bool]) -> float | None:
        with self.lock:
            times = [t for t, kind, pod in self.events if what(kind, pod)]
        return times[-1] if times else None


def generation(pod: Obj) -> int:
    return int(pod["metadata"]["labels"].get(GENERATION_LABEL, -1))


def trainer_terminated(pod: Obj) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return any("terminated" in (s.get("state") or {}) for s in statuses)


def running(pod: Obj) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


@dataclass(frozen=True)
class Run:
    seen: float  # trigger -> failure visible in the API
    delete: float  # seen -> first old pod marked for deletion
    gone: float  # seen -> last old pod removed
    create: float  # last old pod removed -> first new pod created
    running: float  # seen -> every new pod running
    recovery: float | None  # status.lastRecoverySeconds

    @property
    def operator_side(self) -> float:
        return self.delete + self.create


def job_manifest(name: str, workers: int) -> Obj:
    container = {"name": "tensorflow", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", SCRIPT]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MultiWorkerJob", "metadata": {"name": name},
        "spec": {"workers": workers,
                 "restartPolicy": {"maxRestarts": 10, "backoffSeconds": 0},
                 "template": {"spec": {"terminationGracePeriodSeconds": 1,
                                       "containers": [container]}}},
    }


def measure(cluster: Cluster, namespace: str, name: str, workers: int, timeout: float) -> Run:
    timeline, stop = Timeline(), threading.Event()
    follower = threading.Thread(target=timeline.follow, args=(cluster, namespace, name, stop),
                                daemon=True)
    follower.start()
    cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(
        job_manifest(name, workers)))

    def group_running(gen: int) -> Obj | None:
        s = cluster.job_status(namespace, name)
        ok = (s.get("phase") == "Running" and s.get("groupGeneration") == gen
              and s.get("readyWorkers") == workers)
        return s if ok else None

    wait_for(lambda: group_running(0), timeout, POLL_SECONDS, f"{name} generation 0 running")
    victim = f"{name}-worker-{FAILING_WORKER}"
    triggered = time.monotonic()
    # The exec session may die with the container it just stopped (exit 137): no check here;
    # the next generation running is the proof.
    cluster.kubectl("-n", namespace, "exec", victim, "--", "sh", "-c", "kill -USR1 1",
                    check=False)
    status = wait_for(lambda: group_running(1), timeout, POLL_SECONDS,
                      f"{name} generation 1 running")
    wait_for(lambda: new_running(timeline, workers), 10, POLL_SECONDS,
             "the watch to see every new pod running")
    stop.set()

    def old(kind: str, pod: Obj) -> bool:
        return generation(pod) == 0

    seen = timeline.first(lambda k, p: old(k, p) and p["metadata"]["name"] == victim
                          and trainer_terminated(p))
    delete = timeline.first(lambda k, p: old(k, p) and "deletionTimestamp" in p["metadata"])
    gone = timeline.last(lambda k, p: old(k, p) and k == "DELETED")
    created = timeline.first(lambda k, p: generation(p) == 1 and k == "ADDED")
    all_running = new_running(timeline, workers)
    if None in (seen, delete, gone, created) or not all_running:
        raise RuntimeError(f"{name}: incomplete timeline")
    assert seen and delete and gone and created and all_running
    return Run(seen=seen - triggered, delete=delete - seen, gone=gone - seen,
               create=created - gone, running=all_running - seen,
               recovery=status.get("lastRecoverySeconds"))


def new_running(timeline: Timeline, workers: int) -> float | None:
    """When the watch first saw every pod of generation 1 running."""
    state: dict[str, bool] = {}
    with timeline.lock:
        for t, kind, pod in timeline.events:
            if generation(pod) != 1:
                continue
            state[pod["metadata"]["name"]] = kind != "DELETED" and running(pod)
            if len(state) == workers and all(state.values()):
                return t
    return None


# --- report ---


def table(runs: list[Run]) -> str:
    columns = ("run", "fail seen", "->delete", "->old gone", "gone->create", "operator",
               "->running", "lastRecovery")
    rows = [[str(i + 1), *fmt(r)] for i, r in enumerate(runs)]
    medians = [statistics.median(getattr(r, f) for r in runs)
               for f in ("seen", "delete", "gone", "create", "operator_side", "running")]
    recoveries = [r.recovery for r in runs if r.recovery is not None]
    rows.append(["median", *(f"{m:.2f}" for m in medians),
                 f"{statistics.median(recoveries):.2f}" if recoveries else "-"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def fmt(r: Run) -> list[str]:
    recovery = f"{r.recovery:.2f}" if r.recovery is not None else "-"
    return [f"{v:.2f}" for v in (r.seen, r.delete, r.gone, r.create, r.operator_side,
                                 r.running)] + [recovery]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cluster = Cluster(REPO / ".cluster" / "kubeconfig")
    cluster.run(REPO / "hack/images/build.sh", "base")
    cluster.run(REPO / "hack/images/load.sh", "base")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    namespace = f"bench-recovery-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    log = Path(tempfile.mkdtemp(prefix="bench-recovery-")) / "operator.log"
    runs: list[Run] = []
    try:
        with operator(cluster, namespace, log, "--log-level", "debug"):
            for i in range(args.reps):
                name = f"r{i}"
                run = measure(cluster, namespace, name, args.workers, args.timeout)
                runs.append(run)
                print(f"run {i + 1}: " + " ".join(fmt(run)), flush=True)
                cluster.kubectl("-n", namespace, "delete", "mwj", name, "--wait=true")
                wait_for(functools.partial(cluster.pods_gone, namespace, name), args.timeout,
                         POLL_SECONDS, f"{name}'s pods to be gone")
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    print(f"\n{args.workers} workers, {args.reps} runs; seconds; operator log: {log}")
    print("fail seen: kill -> terminated in the API; ->delete, ->old gone, ->running: from "
          "fail seen;\ngone->create: last old pod removed -> first new pod created; "
          "operator: ->delete + gone->create\n")
    print(table(runs))


if __name__ == "__main__":
    main()
