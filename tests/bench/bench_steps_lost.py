"""What a failure costs in training steps, survivor saves on and off: the CPU example
(examples/training/digits.py, checkpoints every 200 steps) as 3 workers on this machine's
loopback (no cluster; not part of CI).

    .venv/bin/python tests/bench/bench_steps_lost.py [--kills 5] [--interval 30]

For each variant (survivor saves on; MWJ_SURVIVOR_SAVES=0), a first generation starts; each
generation trains `--interval` seconds past its first step, then one worker is SIGKILLed (a
different one each time). The others are asked 1 s later for the last step they completed
(their /progress just before the kill, still answering while they wait in their collective,
or the step their survivor save names), then stopped as the operator would (SIGTERM), and the
next generation starts at once. Per kill: the last step
completed, the step the next generation resumed from, and the steps lost between them; then
the medians, and the goodput: the step reached at the end over the wall time (the same kill
schedule for both variants).
"""

from __future__ import annotations

import argparse
import datetime
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from multiworker.api.contract import SURVIVOR_SAVED

from tests.runtime.workers import DIGITS, Launcher, Worker, step_of

WORKERS = 3
ARGS = ("--epochs", "100000", "--target-accuracy", "0")


def wait_training(group: list[Worker], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(step_of(w) for w in group):
            return
        time.sleep(0.2)
    raise SystemExit("a generation did not start training in time")


def saved_step(worker: Worker) -> int:
    found = re.search(re.escape(SURVIVOR_SAVED) + r" (\d+)", worker.log())
    return int(found[1]) if found else 0


def resumed_at(worker: Worker) -> int:
    found = re.search(r"resuming from step (\d+)", worker.log())
    return int(found[1]) if found else 0


def run(variant: str, env: dict[str, str], kills: int, interval: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"steps-lost-{variant}-") as tmp:
        launcher = Launcher(Path(tmp))
        checkpoints = Path(tmp) / "checkpoints"
        env = {**env, "TRAIN_CHECKPOINT_EVERY": "200"}
        started = time.monotonic()
        rows = []
        try:
            group = launcher.start(WORKERS, checkpoint_dir=checkpoints, args=ARGS,
                                   script=DIGITS, env=env)
            for kill in range(kills):
                wait_training(group)
                time.sleep(interval)
                victim = kill % WORKERS
                others = [w for w in group if w.index != victim]
                before = max(step_of(w) or 0 for w in others)
                group[victim].signal(signal.SIGKILL)
                time.sleep(1)
                last = max([before, *(step_of(w) or 0 for w in others),
                            *(saved_step(w) for w in others)])
                for worker in others:
                    if worker.process.poll() is None:
                        worker.signal(signal.SIGTERM)
                for worker in others:
                    try:
                        worker.wait(timeout=30)
                    except subprocess.TimeoutExpired:  # killed, as a kubelet would
                        worker.signal(signal.SIGKILL)
                group = launcher.start(WORKERS, generation=kill + 1,
                                       checkpoint_dir=checkpoints, args=ARGS, script=DIGITS,
                                       env=env)
                wait_training(group)
                resumed = resumed_at(group[0])
                # A survivor whose all-reduce completed before a later collective failed holds
                # the step after the last one the others report: nothing lost then.
                lost = max(0, last - resumed)
                rows.append((kill + 1, victim, last, resumed, lost))
                print(f"{variant:>9} kill {kill + 1}: worker-{victim}, last step {last}, "
                      f"resumed at {resumed}, {lost} steps lost", flush=True)
            time.sleep(interval)
            final = step_of(group[0]) or 0
            wall = time.monotonic() - started
        finally:
            launcher.cleanup()
    lost = [row[4] for row in rows]
    return {"variant": variant, "lost": lost, "median": statistics.median(lost),
            "max": max(lost), "final": final, "wall": wall, "goodput": final / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args()
    results = [run("survivors", {}, args.kills, args.interval),
               run("periodic", {"MWJ_SURVIVOR_SAVES": "0"}, args.kills, args.interval)]
    print(f"\nsteps lost per SIGKILL, {args.kills} kills, one every ~{args.interval:.0f}s of "
          f"training, checkpoints every 200 steps ({datetime.date.today()}, 3 workers on "
          "loopback)")
    print(f"{'variant':<10} {'median lost':>11} {'max lost':>9} {'final step':>10} "
          f"{'wall s':>7} {'goodput steps/s':>15}  per kill")
    for r in results:
        print(f"{r['variant']:<10} {r['median']:>11} {r['max']:>9} {r['final']:>10} "
              f"{r['wall']:>7.0f} {r['goodput']:>15.2f}  {r['lost']}")


if __name__ == "__main__":
    main()
