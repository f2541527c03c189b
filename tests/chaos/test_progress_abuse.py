"""Workers abusing GET /progress (progress_servers.ABUSIVE: endless, dripping, silent, nested,
malformed, absurd) beside an honest job (HONEST) under the same operator. The operator's
memory must stay bounded while it polls them, the abuse must show in status and metrics, and
hang detection must keep working for the honest job: a worker stopped there (SIGSTOP) is
declared hung, and named, as if nothing else were going on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Self

import pytest

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures, operator_log
from tests.chaos.progress_servers import ABUSIVE, HONEST
from tests.chaos.workers import real_job, running_generation, stop_and_await_hang
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs, condition
from tests.support import alone, wait_for

pytestmark = [pytest.mark.usefixtures("images"), pytest.mark.timeout(600),
              alone("no other operator may run (chaos/conftest.py `alone`), and it times hang detection")]

SERVE = 'python3 -c "$SERVER" & echo $! > /tmp/server.pid; wait'
ABUSERS, HONEST_WORKERS = 4, 3
TIMEOUT_SECONDS = 10  # spec.health.progressTimeoutSeconds of both jobs
RSS_GROWTH_BOUND = 64 << 20  # one endless body read whole would pass it within a poll


def serving(name: str, script: str, workers: int, env: dict[str, str],
            volume: dict[str, object] | None = None) -> dict[str, object]:
    manifest = real_job(name, SERVE, workers=workers,
                        health={"progressTimeoutSeconds": TIMEOUT_SECONDS})
    pod_spec = manifest["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    container["env"] = [{"name": "SERVER", "value": script},
                        *({"name": k, "value": v} for k, v in env.items())]
    if volume is not None:
        pod_spec["volumes"] = [{"name": "shared", **volume}]
        container["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    return manifest


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class Sampler:
    """The operator's RSS every 0.2 s in a thread, and the most it reached."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.samples = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, rss(self.pid))
            self.samples += 1

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def test_abusive_progress_servers_leave_memory_and_hang_detection_intact(
    chaos: Chaos, jobs: Jobs, operator: OperatorProcess, shared_dir: str, figures: Figures,
) -> None:
    rng = chaos.rng("progress-abuse")
    pacemaker = rng.randrange(HONEST_WORKERS)
    assert operator.proc is not None
    pid = operator.proc.pid
    jobs.apply(serving("honest", HONEST, HONEST_WORKERS, {"PACEMAKER": str(pacemaker)},
                       {"hostPath": {"path": shared_dir, "type": "DirectoryOrCreate"}}))
    wait_for(lambda: (jobs.status("honest").get("progress") or {}).get("step"), 120, 0.5,
             lambda: f"the honest job's progress in status\n{jobs.describe('honest')}")
    baseline = rss(pid)

    with Sampler(pid) as sampler:
        jobs.apply(serving("abuse", ABUSIVE, ABUSERS, {}))
        wait_for(lambda: running_generation(jobs, "abuse", ABUSERS, 0), 120, 0.5,
                 lambda: f"the abusive job running\n{jobs.describe('abuse')}")
        abuse_started = time.monotonic()
        bad = wait_for(lambda: condition(jobs.status("abuse"), "ProgressReporting"), 60, 0.5,
                       lambda: f"ProgressReporting on the abusive job\n{jobs.describe('abuse')}")
        # The abuse goes on for a while before anything else: many polls of every kind.
        while time.monotonic() - abuse_started < chaos.abuse_seconds:
            assert jobs.status("honest")["restarts"] == 0, jobs.describe("honest")
            time.sleep(1)
        status, detected = stop_and_await_hang(jobs, "honest", pacemaker)
        stopped = time.monotonic() - detected
    failure = status["lastFailure"]
    abuse = jobs.status("abuse")
    log = operator_log(operator.log_path)
    bad_reports = operator.metric("multiworker_bad_progress_reports_total")
    errors = operator.metric("multiworker_reconcile_errors_total")
    figures(f"{ABUSERS} abusive workers polled for {stopped - abuse_started:.0f}s "
            f"({bad_reports:.0f} bad reports counted; abusive job: {abuse.get('phase')}, "
            f"restarts {abuse.get('restarts')}, ProgressReporting={bad['status']} "
            f"{bad['reason']}: {bad['message'][:160]})")
    figures(f"operator RSS: {baseline / 2**20:.1f} MiB before the abuse, peak "
            f"{sampler.peak / 2**20:.1f} MiB during it ({sampler.samples} samples; bound "
            f"+{RSS_GROWTH_BOUND >> 20} MiB)")
    figures(f"honest job: worker-{pacemaker} SIGSTOPped, declared hung after {detected:.1f}s "
            f"(progressTimeoutSeconds {TIMEOUT_SECONDS}): {failure['reason']}, worker "
            f"{failure['worker']}: {failure['message'][:160]}")
    figures(f"operator: {errors:.0f} failed passes, "
            f"{log.count('polling progress of')} failed polls, {log.count('Traceback')} "
            "tracebacks")
    assert sampler.peak - baseline < RSS_GROWTH_BOUND
    assert (failure["reason"], failure["worker"]) == ("ProgressStalled", pacemaker)
    assert status["restarts"] == 1 and status["disruptions"] == 0
    assert bad["status"] == "False" and bad["reason"] == "BadProgressReports", bad
    assert bad_reports > 0
    assert errors == 0 and "polling progress of" not in log and "Traceback" not in log
