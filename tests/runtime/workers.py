"""Real TensorFlow workers as subprocesses on loopback, as the operator would start them.

`Launcher.start` starts `examples/training/train.py` once per worker with the environment the operator
injects (TF_CONFIG with `localhost:<free port>` names, MWJ_*), each in its own session so a test
can SIGKILL/SIGSTOP/SIGTERM one worker. Logs go to files under tmp_path and are printed when a
test fails; every process still alive at teardown is continued and killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import free_ports

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "training" / "train.py"  # synthetic and fast, with test knobs
DIGITS = REPO / "examples" / "training" / "digits.py"  # the example jobs run
QUIET_TF = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONUNBUFFERED": "1",
}
# Short enough to keep the tier fast, long enough for the first step's tracing on 2 busy cores.
COLLECTIVE_TIMEOUT = 15.0
PEER_TIMEOUT = 60.0


def loopback_group(count: int) -> tuple[list[str], list[int]]:
    """The TF_CONFIG peers and progress ports of a group of `count` on loopback, all distinct."""
    ports = free_ports(2 * count)
    return [f"localhost:{port}" for port in ports[:count]], ports[count:]


def worker_env(
    peers: list[str],
    index: int,
    generation: int,
    checkpoint_dir: Path | None,
    progress_ports: list[int],
) -> dict[str, str]:
    """The operator's worker environment (docs/contracts.md) for one loopback worker, plus
    MWJ_PROGRESS_PORTS: on one host each worker needs its own progress port, and the
    preflight must know the others'."""
    env = {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": peers}, "task": {"type": "worker", "index": index}}
        ),
        "MWJ_JOB_NAME": "runtime-test",
        "MWJ_NUM_WORKERS": str(len(peers)),
        "MWJ_WORKER_INDEX": str(index),
        "MWJ_RESTART_COUNT": str(generation),
        "MWJ_PROGRESS_PORT": str(progress_ports[index]),
        "MWJ_PROGRESS_PORTS": ",".join(map(str, progress_ports)),
        "MWJ_PEER_TIMEOUT_SECONDS": str(PEER_TIMEOUT),
        "MWJ_COLLECTIVE_TIMEOUT_SECONDS": str(COLLECTIVE_TIMEOUT),
    }
    if checkpoint_dir is not None:
        env["MWJ_CHECKPOINT_DIR"] = str(checkpoint_dir)
    return env


@dataclass
class Worker:
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    progress_port: int
    started: float = field(default_factory=time.monotonic)

    def progress(
        self, timeout: float = 1.0, path: str = "/progress"
    ) -> dict[str, Any] | None:
        """GET /progress (or `path`), or None when the worker does not answer (not up,
        stopped, gone) or answers with an error."""
        url = f"http://127.0.0.1:{self.progress_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body: dict[str, Any] = json.load(response)
                return body
        except OSError:
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)


@dataclass
class Launcher:
    """Starts groups of workers; remembers every process so teardown can clean up."""

    tmp_path: Path
    workers: list[Worker] = field(default_factory=list)

    def start(
        self,
        num_workers: int,
        *,
        generation: int = 0,
        checkpoint_dir: Path | None = None,
        args: tuple[str, ...] = (),
        peers: list[str] | None = None,
        only: tuple[int, ...] | None = None,
        env: dict[str, str] | None = None,
        progress_ports: list[int] | None = None,
        python: str = sys.executable,
        script: Path = TRAIN,
    ) -> list[Worker]:
        """Starts workers `only` (default all) of a group whose TF_CONFIG lists `peers`
        and whose progress ports are `progress_ports` (default: fresh loopback ports), each
        running `script` (default: the synthetic trainer)."""
        fresh_peers, fresh_ports = loopback_group(num_workers)
        peers = peers or fresh_peers
        progress_ports = progress_ports or fresh_ports
        started = []
        for index in only if only is not None else range(num_workers):
            port = progress_ports[index]
            worker_env_vars = worker_env(
                peers, index, generation, checkpoint_dir, progress_ports
            )
            log_path = self.tmp_path / f"gen{generation}-worker{index}.log"
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [python, str(script), *args],
                    env={**os.environ, **QUIET_TF, **worker_env_vars, **(env or {})},
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=REPO,
                )
            started.append(Worker(index, process, log_path, port))
        self.workers.extend(started)
        return started

    def cleanup(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGKILL)
                worker.process.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(
            f"===== {w.log_path.name} (exit {w.process.poll()})\n{_tail(w.log())}"
            for w in self.workers
        )


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def latest_checkpoint_step(checkpoint_dir: Path) -> int:
    """The step of the chief's latest checkpoint, from TF's `checkpoint` state file."""
    state = (checkpoint_dir / "checkpoint").read_text()
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.MULTILINE)
    assert match, state
    return int(match.group(1))


def step_of(worker: Worker) -> int | None:
    progress = worker.progress()
    return progress["step"] if progress and progress["phase"] == "training" else None


def wait_exits(
    workers: list[Worker], timeout: float, since: float
) -> dict[int, tuple[int, float]]:
    """Exit code and seconds from `since` to exit, per worker index."""
    deadline = time.monotonic() + timeout
    results: dict[int, tuple[int, float]] = {}
    while len(results) < len(workers) and time.monotonic() < deadline:
        for worker in workers:
            code = worker.process.poll()
            if code is not None and worker.index not in results:
                results[worker.index] = (code, time.monotonic() - since)
        time.sleep(0.1)
    return results
