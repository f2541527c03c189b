"""What a SIGKILL costs at real model sizes: the survivors' save (seconds, bytes), the next
group's restore, steps lost, and the per-step cost of the survivors' witness, for models of
about 10 M to 250 M parameters trained with Adam (12 bytes of state a parameter), 3 and 4
workers of the runtime on this machine's loopback (no cluster; not part of CI).

    .venv/bin/python tests/bench/bench_survivor_size.py [--params 10e6,100e6] [--workers 3,4]
        [--code main=operator/src --code before=/tmp/old/operator/src] [--broadcast]

Each `--code NAME=DIR` runs the runtime from DIR (PYTHONPATH): today's code beside a
checkout of an earlier commit, side by side. Per case: a group trains tests/bench/
sized_trainer.py (a checkpoint every 4 steps); after 6 steps worker 1 is SIGKILLed; a second
later the bench does what the operator does with a broken group — SIGTERM to the survivors,
SIGKILL after the grace period: the operator's own rule (decide/policy.survivor_save_grace)
applied to the chief's report, or 10 s (the old default of spec.restartPolicy.
survivorSaveSeconds) for a runtime that reports no expected save time. Then a new group
starts and restores. The volume's write rate is measured in the same case, between the two
groups: N-1 processes writing S/(N-1) distinct bytes each to the checkpoint directory and
syncing them, as the survivors now sync their parts (the old code's replicas were not synced);
the median of three.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from multiworker.decide.policy import survivor_save_grace

from tests.runtime.workers import Launcher, Worker, loopback_group

TRAINER = Path(__file__).with_name("sized_trainer.py")
OLD_GRACE = 10  # spec.restartPolicy.survivorSaveSeconds before it followed the report
CAP = 300  # its default now
KILL_AT_STEP = 6
SLOW = {"MWJ_COLLECTIVE_TIMEOUT_SECONDS": "300", "MWJ_PEER_TIMEOUT_SECONDS": "300"}


def figures(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def wait(condition: Any, timeout: float, what: str, group: list[Worker]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        if any(w.process.poll() is not None for w in group):
            raise SystemExit(f"a worker exited while waiting for {what}:\n" +
                             "\n".join(w.log()[-2000:] for w in group))
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def write_rate(directory: Path, total: int, writers: int) -> float:
    """Bytes/s of `writers` processes writing `total` bytes between them into `directory` and
    syncing them. Each writes distinct bytes it holds in memory, as a survivor does: one
    buffer written again and again stays in the CPU's cache, and measured 2-4 times faster
    here, where the volume is the page cache in front of a virtual disk."""
    share = total // writers
    code = ("import os,sys,time; import numpy as np; p=sys.argv[1]; "
            "d=np.random.default_rng().integers(0,255,int(sys.argv[2]),dtype=np.uint8).data; "
            "open(p+'.ready','w').close()\n"
            "while not os.path.exists(sys.argv[3]): time.sleep(0.005)\n"
            "f=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)\n"
            "while d: d=d[os.write(f,d[:1<<22]):]\n"
            "os.fsync(f); os.close(f)")
    go = directory / "rate-go"
    paths = [directory / f"rate-{i}" for i in range(writers)]
    processes = [subprocess.Popen([sys.executable, "-c", code, str(path), str(share), str(go)])
                 for path in paths]
    while not all(Path(f"{path}.ready").exists() for path in paths):
        time.sleep(0.05)
    started = time.monotonic()
    go.touch()
    for process in processes:
        process.wait()
    seconds = time.monotonic() - started
    for path in [*paths, *(Path(f"{p}.ready") for p in paths), go]:
        path.unlink()
    return share * writers / seconds


def saves(worker: Worker, killed: float) -> tuple[float | None, int, str]:
    """A survivor's save from its log: seconds, the MB it wrote (today's code says; the old
    code wrote a whole replica: counted from the files), and when it started after the kill
    and what it wrote (its log line's time less its seconds; the parts it says)."""
    text = worker.log()
    found = re.search(r"^(\S+ \S+) .*saved this survivor's state at step \d+ in ([\d.]+)s(.*)",
                      text, re.MULTILINE)
    if not found:
        return None, 0, ""
    seconds = float(found[2])
    ended = datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    mb = re.search(r"([\d.]+) MB", found[3])
    parts = re.search(r"wrote (\d+ of \d+) parts", found[3])
    said = f"started +{ended - seconds - killed:.2f}s, {seconds:.2f}s" + \
        (f", {parts[1]} parts" if parts else "")
    return seconds, int(float(mb[1]) * 1e6) if mb else -1, said


def start(launcher: Launcher, root: Path, generation: int, workers: int, env: dict[str, str],
          args: tuple[str, ...]) -> tuple[list[Worker], list[Path]]:
    """A group, each worker writing its figures to its own file."""
    peers, ports = loopback_group(workers)
    figs = [root / f"gen{generation}-w{i}.json" for i in range(workers)]
    group = [launcher.start(workers, generation=generation, checkpoint_dir=root / "checkpoints",
                            script=TRAINER, env=env, only=(i,), peers=peers,
                            progress_ports=ports, args=(*args, "--figures", str(fig)))[0]
             for i, fig in enumerate(figs)]
    return group, figs


def case(code: str, src: str, workers: int, params: float, broadcast: bool) -> dict[str, Any]:
    env = {**SLOW, "PYTHONPATH": src}
    with tempfile.TemporaryDirectory(prefix=f"survivor-size-{code}-") as tmp:
        root = Path(tmp)
        launcher = Launcher(root)
        checkpoints = root / "checkpoints"
        checkpoints.mkdir()
        try:
            group, figs = start(launcher, root, 0, workers, env, ("--params", str(params)))
            wait(lambda: all(figures(f).get("step", 0) >= KILL_AT_STEP for f in figs), 1800,
                 "the first group's steps", group)
            chief = group[0].progress() or {}
            before = figures(figs[0])
            state = _state_bytes(before["params"])
            last = max(figures(f).get("step", 0) for f in figs)
            os.sync()  # the save starts, as the write rate's measure will, with no dirty pages
            group[1].signal(signal.SIGKILL)
            killed, killed_at = time.monotonic(), time.time()
            time.sleep(1)
            expected = chief.get("expectedSaveSeconds")
            grace = OLD_GRACE if expected is None else survivor_save_grace(
                expected, chief.get("stepsPerSecond"), CAP)
            survivors = [w for w in group if w.index != 1]
            for worker in survivors:
                worker.signal(signal.SIGTERM)
            deadline = killed + 1 + grace
            for worker in survivors:
                try:
                    worker.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    worker.signal(signal.SIGKILL)
                    worker.wait(timeout=30)
            stopped = time.monotonic() - killed
            last = max([last, *(figures(f).get("step", 0) for f in figs)])
            per_survivor = [saves(w, killed_at) for w in survivors]
            written = du(checkpoints / "survivors")
            os.sync()
            rates = [write_rate(checkpoints, state, workers - 1) for _ in range(3)]  # idle
            rate = statistics.median(rates)
            second, next_figs = start(launcher, root, 1, workers, env, (
                "--params", str(params), *(("--broadcast",) if broadcast else ())))
            wait(lambda: all("restore" in figures(f) for f in next_figs), 1800, "the restore",
                 second)
            after = [figures(f) for f in next_figs]
            for worker in second:
                worker.signal(signal.SIGKILL)
        finally:
            launcher.cleanup()
    resumed = after[0].get("restored", 0)
    seconds = [s for s, _, _ in per_survivor if s is not None]
    step = before["step_median"]
    witness = before["witness_median"]
    return {
        "code": code, "workers": workers, "params": before["params"], "state": state,
        "step": step, "witness": witness, "overhead": witness / max(step - witness, 1e-9),
        "rate": rate, "rates": rates, "expected": expected, "grace": grace, "stopped": stopped,
        "saved": len(seconds), "survivors": len(survivors),
        "save_max": max(seconds, default=None), "written": written,
        "survivor_saves": [said for _, _, said in per_survivor],
        "restore": statistics.median(a["restore"] for a in after),
        "broadcast": statistics.median(a["broadcast"] for a in after) if broadcast else None,
        "last": last, "resumed": resumed, "lost": max(0, last - resumed),
    }


def _state_bytes(params: int) -> int:
    return params * 12 + 16  # weights and two Adam slots, float32; the counters


def show(rows: list[dict[str, Any]]) -> None:
    def mb(n: float | None) -> str:
        return "" if n is None else f"{n / 1e6:,.0f}"

    def s(n: float | None, digits: int = 1) -> str:
        return "" if n is None else f"{n:.{digits}f}"

    print(f"\nsurvivor saves by model size ({datetime.date.today()}, loopback, "
          f"{os.cpu_count()} cores; S: model + Adam state; write rate: N-1 synced writers of S/(N-1))")
    head = ("code", "N", "params M", "S MB", "step s", "witness ms", "witness %",
            "write MB/s", "expect s", "grace s", "saved", "save s", "save/(S/rate)",
            "written MB", "written/S", "restore s", "bcast s", "lost")
    print(" | ".join(head))
    for r in rows:
        ideal = r["state"] / r["rate"]
        print(" | ".join([
            r["code"], str(r["workers"]), f"{r['params'] / 1e6:.0f}", mb(r["state"]),
            s(r["step"], 2), s(r["witness"] * 1e3, 2), s(100 * r["overhead"], 2),
            f"{r['rate'] / 1e6:,.0f}", s(r["expected"], 2), str(r["grace"]),
            f"{r['saved']}/{r['survivors']}", s(r["save_max"], 2),
            s(r["save_max"] / ideal if r["save_max"] else None, 2), mb(r["written"]),
            s(r["written"] / r["state"], 2), s(r["restore"], 2), s(r["broadcast"], 2),
            f"{r['lost']} ({r['last']}->{r['resumed']})"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="10e6,100e6")
    parser.add_argument("--workers", default="3,4")
    parser.add_argument("--code", action="append", default=[],
                        help="NAME=DIR: the runtime's source to run (default: this checkout)")
    parser.add_argument("--broadcast", action="store_true",
                        help="also time an all-reduce of the whole state in the new group")
    args = parser.parse_args()
    codes = [c.split("=", 1) for c in args.code] or \
        [["main", str(Path(__file__).resolve().parents[2] / "operator" / "src")]]
    rows = []
    for params in (float(p) for p in args.params.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            for name, src in codes:
                row = case(name, str(Path(src).resolve()), workers, params, args.broadcast)
                print(json.dumps(row), flush=True)
                rows.append(row)
    show(rows)


if __name__ == "__main__":
    main()
