"""What a restarted group's start-up would cost with TensorFlow already imported: the CPU
example's workers on this machine's loopback, cold against warm (no cluster; not part of CI).

    .venv/bin/python tests/bench/bench_warm_start.py [--reps 5] [--workers 3]

An in-place restart (docs/restarts.md) gets its pods back in about 2 s; most of
what follows, until the new generation's first step, is TensorFlow's start-up in the new
processes, and `RestartAllContainers` leaves no process alive that could have paid any of it
before the failure. This measures how much of that start-up could be paid before: the CPU
example (examples/training/digits.py, checkpointing to a temporary directory) runs as
`--workers` processes on 127.0.0.1 (TF_CONFIG, MWJ_PROGRESS_PORTS on free loopback ports). A
first generation trains until its first checkpoint; then, alternating, a new generation
starts either cold (the script's process starts at t = 0, as the kubelet starts a trainer) or
warm (each process has imported TensorFlow, Keras, NumPy and multiworker.runtime, then waits;
t = 0 is the go, and the script runs in the same interpreter). Each run ends at the first
step past the restored one on any worker's GET /progress, and is killed after its next
checkpoint (its successor restores from there). Worker-0's log gives the parts, as in
bench_in_place.py: import (until /progress is served), peers, strategy, restore (until the
step). Prints one row per run, then medians and maxima.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.harness import REPO
from tests.support import free_ports

EXAMPLE = REPO / "examples" / "training" / "digits.py"
PARTS = (("import", "serving progress on"), ("peers", "preflight passed"),
         ("strategy", "strategy ready"))
POLL_SECONDS = 0.05
# The warm process: what the script would import anyway, paid before the go; then the script,
# in this interpreter, as `python3 digits.py` would run it.
WARM = """
import os, runpy, sys, time
import keras, numpy, tensorflow
import multiworker.runtime
open(os.environ["BENCH_READY"], "w").close()
while not os.path.exists(os.environ["BENCH_GO"]):
    time.sleep(0.005)
sys.argv = [sys.argv[1]]
sys.path[0] = os.path.dirname(sys.argv[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--workers", type=int, default=3, help="workers (default 3)")
    parser.add_argument("--timeout", type=float, default=180)
    return parser.parse_args(argv)


class Group:
    """One generation of `workers` processes of the example."""

    def __init__(self, workdir: Path, workers: int, generation: int, warm: bool) -> None:
        self.workdir, self.workers, self.generation = workdir, workers, generation
        ports = free_ports(2 * workers)
        tf_ports, self.progress_ports = ports[:workers], ports[workers:]
        self.go = workdir / f"go-{generation}"
        self.logs = [workdir / f"gen{generation}-worker{i}.log" for i in range(workers)]
        cluster = {"worker": [f"127.0.0.1:{p}" for p in tf_ports]}
        self.procs = []
        for i in range(workers):
            env = dict(os.environ,
                       TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": "worker", "index": i}}),
                       MWJ_NUM_WORKERS=str(workers), MWJ_WORKER_INDEX=str(i),
                       MWJ_PROGRESS_PORTS=",".join(map(str, self.progress_ports)),
                       MWJ_CHECKPOINT_DIR=str(workdir / "checkpoints"),
                       MWJ_RESTART_COUNT=str(generation), MWJ_PEER_TIMEOUT_SECONDS="60",
                       TRAIN_EPOCHS="1000", TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=str(REPO / "operator" / "src"),
                       BENCH_READY=str(workdir / f"ready-{generation}-{i}"), BENCH_GO=str(self.go))
            argv = [sys.executable, "-c", WARM, str(EXAMPLE)] if warm else \
                [sys.executable, str(EXAMPLE)]
            with self.logs[i].open("w") as log:
                self.procs.append(subprocess.Popen(argv, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def ready(self) -> bool:
        return all((self.workdir / f"ready-{self.generation}-{i}").exists()
                   for i in range(self.workers))

    def progress(self, i: int) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.progress_ports[i]}/progress"
        try:
            with urllib.request.urlopen(url, timeout=0.3) as answer:
                return dict(json.loads(answer.read()))
        except (OSError, ValueError):
            return {}

    def check_alive(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"worker {i} of generation {self.generation} exited "
                                   f"{proc.returncode}: see {self.logs[i]}")

    def wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"generation {self.generation}: {what} after {timeout}s")
            time.sleep(POLL_SECONDS)

    def stepped_past_restore(self) -> bool:
        return any(p.get("step", 0) > p.get("restoredFromStep", 0) > 0
                   for p in map(self.progress, range(self.workers)))

    def checkpointed_since(self, step: int) -> bool:
        return (self.progress(0).get("lastCheckpointStep") or 0) > step

    def kill(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def parts(log: Path, t0: float, step: float) -> dict[str, float]:
    """Worker-0's start-up parts, as durations, from its log's timestamps (wall clock)."""
    ends: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        for part, marker in PARTS:
            if marker in line and part not in ends:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                ends[part] = stamp.timestamp() - t0
    found, start = {}, 0.0
    for part, _ in PARTS:
        if part in ends:
            found[part], start = ends[part] - start, ends[part]
    found["restore"] = step - start
    return found


def one_run(workdir: Path, workers: int, generation: int, warm: bool,
            timeout: float) -> dict[str, float]:
    group = Group(workdir, workers, generation, warm)
    try:
        if warm:
            group.wait(group.ready, timeout, "not every process imported")
            time.sleep(1.0)  # the imports' last threads settle, as while a group trains
            t0_wall, t0 = time.time(), time.monotonic()
            group.go.touch()
        else:
            t0_wall, t0 = time.time(), time.monotonic()
        group.wait(group.stepped_past_restore, timeout, "no step past the restored one")
        step = time.monotonic() - t0
        restored = group.progress(0).get("restoredFromStep") or 0
        group.wait(lambda: group.checkpointed_since(restored), timeout, "no new checkpoint")
        return {"step": step} | parts(group.logs[0], t0_wall, step)
    finally:
        group.kill()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="mw-warm-") as tmp:
        workdir = Path(tmp)
        first = Group(workdir, args.workers, 0, warm=False)
        try:
            first.wait(lambda: first.checkpointed_since(0), args.timeout, "no first checkpoint")
        finally:
            first.kill()
        runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
        generation = 0
        for _ in range(args.reps):
            for mode, done in runs.items():
                generation += 1
                run = one_run(workdir, args.workers, generation, mode == "warm", args.timeout)
                done.append(run)
                print(f"{mode}  " + "  ".join(f"{k} {v:5.2f}s" for k, v in run.items()),
                      flush=True)
    keys = ["step", *(p for p, _ in PARTS), "restore"]
    print(f"\n{args.workers} workers of the CPU example on loopback, {os.cpu_count()} cores, "
          f"{args.reps} runs per mode: seconds to the first step past the restored one, "
          "and its parts (worker 0), median (max)")
    print(f"{'mode':5} " + "  ".join(f"{k:>14}" for k in keys))
    for mode, found in runs.items():
        cells = []
        for k in keys:
            values = [r[k] for r in found if k in r]
            cells.append(f"{statistics.median(values):6.2f} ({max(values):5.2f})"
                         if values else f"{'-':>14}")
        print(f"{mode:5} " + "  ".join(cells))
    cold = statistics.median(r["step"] for r in runs["cold"])
    warm = statistics.median(r["step"] for r in runs["warm"])
    print(f"warm / cold (medians): {warm / cold:.2f}; paid before the go: {cold - warm:.2f} s")


if __name__ == "__main__":
    main()
