"""Jobs of real pods on the real node (the base image: sh, sleep, python3) for the cases that
need real kubelets: the control-plane, leader and /progress cases.

A worker fails on demand: its shell (PID 1) traps SIGUSR1 and exits 1, so `fail_worker` is one
`kubectl exec`. It ignores SIGTERM (PID 1 without a handler), so a deleted worker stays in its
terminating tail for the whole grace period — long enough for a new group that started too
early to show beside it.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from tests.integration.jobs import BASE, GROUP, VERSION, Jobs
from tests.support import wait_for

Obj = dict[str, Any]
GRACE_SECONDS = 2
ON_DEMAND = 'trap "exit 1" USR1; sleep 3600 & wait'


def real_job(name: str, script: str = ON_DEMAND, workers: int = 3, **spec: Any) -> Obj:
    container = {"name": "tensorflow", "image": BASE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", textwrap.dedent(script).strip()]}
    pod_spec = {"terminationGracePeriodSeconds": GRACE_SECONDS, "containers": [container]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MultiWorkerJob",
        "metadata": {"name": name},
        "spec": {"workers": workers, "template": {"spec": pod_spec}, **spec},
    }


def fail_worker(jobs: Jobs, job: str, index: int) -> None:
    """Worker `index` exits 1 (its shell traps SIGUSR1). The exec'd shell may die with the
    container before it returns (137): that is success too."""
    proc = jobs.kubectl("exec", f"{job}-worker-{index}", "-c", "tensorflow", "--",
                        "sh", "-c", "kill -USR1 1", check=False)
    assert proc.returncode in (0, 137), f"kill -USR1 1 in worker {index}: {proc.stderr}"


def running_generation(jobs: Jobs, name: str, workers: int, generation: int) -> Obj | None:
    s = jobs.status(name)
    done = s.get("phase") == "Running" and s.get("groupGeneration") == generation and \
        s.get("ready") == f"{workers}/{workers}"
    return s if done else None


def stop_and_await_hang(jobs: Jobs, job: str, index: int) -> tuple[Obj, float]:
    """SIGSTOP worker `index`'s /progress server (progress_servers.HONEST writes its pid to
    /tmp/server.pid); the job's status once it counts a restart, and the seconds that took."""
    jobs.kubectl("exec", f"{job}-worker-{index}", "-c", "tensorflow", "--", "sh", "-c",
                 "kill -STOP $(cat /tmp/server.pid)")
    stopped = time.monotonic()
    status: Obj = wait_for(lambda: (s := jobs.status(job)).get("restarts") and s, 90, 0.2,
                           lambda: f"the stopped worker of {job} declared hung\n"
                           f"{jobs.describe(job)}")
    return status, time.monotonic() - stopped
