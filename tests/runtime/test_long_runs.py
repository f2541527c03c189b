"""Long runs: a trainer's threads and memory do not grow with the number of collectives it ran.

With TensorFlow's `CommunicationOptions(timeout_seconds=...)` every collective left a thread
alive for the whole timeout: a trainer grew by ~200 threads a second and died of it after 49 s
on the local cluster. The runtime bounds collectives with one watchdog thread instead
(runtime/watchdog.py); here two workers run 2,000 training steps (each at least one gradient
all-reduce, plus the loss's reduction and the stop checks) and each one's thread count is
compared with its count after the first steps. Memory: TensorFlow kept a record per collective
call (runtime/collective.py), 3.2 KB a step here; the resident memory after 2,000 steps is
compared with its size after the first steps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.workers import Launcher, Worker, step_of, wait_exits

STEPS = 2000
SETTLED_STEP = 20  # thread pools are filled by then
# Threads a trainer may start after its first steps: a few of TensorFlow's pool threads are
# created on first use (measured: 0-3).
SLACK = 10
# Resident memory a trainer may gain after its first steps (allocator pages, caches filled on
# first use; measured 1-2 MiB with fixed keys, ~6 MiB per 2,000 steps with a record per call).
RSS_SLACK_MIB = 4.0


def threads(worker: Worker) -> int:
    return len(os.listdir(f"/proc/{worker.process.pid}/task"))


def rss_mib(worker: Worker) -> float:
    status = Path(f"/proc/{worker.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:"))
               .split()[1]) / 1024


@pytest.mark.timeout(420)
def test_threads_and_memory_stay_flat_over_thousands_of_collectives(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    workers = launcher.start(
        2, args=("--epochs", "1", "--steps-per-epoch", str(STEPS), "--target-loss", "1")
    )
    deadline = time.monotonic() + 300
    baseline: dict[int, int] = {}
    peak: dict[int, int] = {}
    last: dict[int, int] = {}
    memory: dict[int, list[float]] = {}
    while time.monotonic() < deadline and any(w.process.poll() is None for w in workers):
        for worker in workers:
            step = step_of(worker)
            if step is None or worker.process.poll() is not None:
                continue
            try:
                count, resident = threads(worker), rss_mib(worker)
            except (FileNotFoundError, StopIteration):  # exited between the poll and the read
                continue
            last[worker.index] = step
            if step >= SETTLED_STEP:
                baseline.setdefault(worker.index, count)
                peak[worker.index] = max(peak.get(worker.index, 0), count)
                memory.setdefault(worker.index, []).append(resident)
        time.sleep(0.5)
    exits = wait_exits(workers, 60, time.monotonic())
    gained = {i: round(samples[-1] - samples[0], 1) for i, samples in memory.items()}
    report(f"{STEPS} steps on 2 workers: threads after step {SETTLED_STEP} {baseline}, "
           f"peak {peak}, last step seen {last}; resident memory gained (MiB) {gained}")
    assert {i: code for i, (code, _) in exits.items()} == {0: 0, 1: 0}
    assert len(baseline) == 2, f"no thread count after step {SETTLED_STEP}: {last}"
    grown = {i: peak[i] - baseline[i] for i in baseline}
    assert max(grown.values()) <= SLACK, (
        f"threads grew by {grown} over {STEPS} steps (after step {SETTLED_STEP}: {baseline}, "
        f"peak {peak}): something starts a thread per collective"
    )
    assert max(gained.values()) <= RSS_SLACK_MIB, (
        f"resident memory grew by {gained} MiB over {STEPS} steps: something keeps a record "
        "per collective call"
    )
