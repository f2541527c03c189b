"""The local cluster's own processes (hack/cluster/: PIDs in .cluster/pids/), for the cases
that kill, stop and restart parts of the control plane. Only `CLUSTER=local` has them.

Restarting goes through hack/cluster/restart.sh, which starts a component exactly as up.sh
does; the process outlives the test (it is the shared cluster's)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import REPO
from tests.support import wait_for


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: it serves nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


@dataclass
class ControlPlane:
    state: Path = REPO / ".cluster"

    def pid(self, component: str) -> int:
        pid = int((self.state / "pids" / f"{component}.pid").read_text())
        assert not _gone(pid), f"{component} ({pid}) is not running"
        return pid

    def kill(self, component: str) -> float:
        """SIGKILL; the monotonic time it was sent."""
        pid = self.pid(component)
        sent = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _gone(pid), 30, 0.05, f"{component} ({pid}) to die")
        return sent

    def pause(self, component: str) -> int:
        """SIGSTOP: the process stays, frozen (connections open, nothing answered)."""
        pid = self.pid(component)
        os.kill(pid, signal.SIGSTOP)
        return pid

    def resume(self, pid: int) -> None:
        os.kill(pid, signal.SIGCONT)

    def freeze(self, component: str, seconds: float) -> tuple[float, float]:
        """SIGSTOP for `seconds`, always continued; (stopped, continued) monotonic times."""
        pid = self.pause(component)
        stopped = time.monotonic()
        try:
            time.sleep(seconds)  # how long it stays frozen is the caller's subject
        finally:
            self.resume(pid)
        return stopped, time.monotonic()

    def restart(self, component: str) -> float:
        """Start it again (restart.sh), wait until it serves; the seconds that took."""
        started = time.monotonic()
        subprocess.run([str(REPO / "hack/cluster/restart.sh"), component], check=True,
                       timeout=240, cwd=REPO)
        return time.monotonic() - started
