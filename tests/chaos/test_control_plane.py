"""The control plane fails under the operator: kube-apiserver SIGKILLed in the middle of a
group restart and started again (hack/cluster/restart.sh); etcd frozen (SIGSTOP) for 20 s.
Either way the job must converge to exactly one restart — nothing doubled, nothing lost, no
decision taken on a half-seen cluster — and the invariants must hold over the test's own
watch (which itself loses events while the API server is down: those gaps are reported).
And an API server down long enough that no node renews its Lease and the operator's Lease
watch backs off must restart no job, not even those whose workers cannot prove their node up
by answering /progress.

These cases stop the shared cluster's control plane: they run only inside one hold of the
cluster lock (see conftest.py), and always start (or continue) what they stopped.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures, operator_log
from tests.chaos.control import ControlPlane
from tests.chaos.invariants import check
from tests.chaos.recorder import Recorder
from tests.chaos.workers import fail_worker, real_job, running_generation
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs
from tests.support import alone, wait_for

pytestmark = [pytest.mark.usefixtures("images"), pytest.mark.timeout(900),
              alone("it kills the API server and freezes etcd")]

WORKERS = 3
ETCD_PAUSE_SECONDS = 20.0
# Longer than a node Lease's silence before it is trouble (12 s) and than nodeLostSeconds (20);
# shorter than the node lifecycle controller's grace (50 s): the nodes stay Ready.
API_SERVER_DOWN_SECONDS = 25.0
# The operator's Lease watch retries back off up to 30 s; a node loss then takes 20 s more.
QUIET_WATCH_SECONDS = 55.0


def trigger_restart(jobs: Jobs, name: str, counted: bool, worker: int) -> None:
    """A counted restart (a worker exits 1) or a disruption (a worker pod is deleted)."""
    if counted:
        fail_worker(jobs, name, worker)
    else:
        jobs.kubectl("delete", "pod", f"{name}-worker-{worker}", "--wait=false")


def settled(jobs: Jobs, name: str, counted: bool) -> bool:
    s = running_generation(jobs, name, WORKERS, 1)
    return s is not None and (s["restarts"], s["disruptions"]) == ((1, 0) if counted else (0, 1))


def describe_phase(jobs: Jobs, name: str) -> str:
    s = jobs.status(name)
    return f"{s.get('phase')}/generation {s.get('groupGeneration')}"


def start_job(jobs: Jobs, name: str) -> None:
    jobs.apply(real_job(name, restartPolicy={"backoffSeconds": 1}))
    wait_for(lambda: running_generation(jobs, name, WORKERS, 0), 120, 0.2,
             lambda: f"{name} running\n{jobs.describe(name)}")


def wait_settled(jobs: Jobs, name: str, counted: bool, recorder: Recorder) -> None:
    what = "restart" if counted else "disruption"
    wait_for(lambda: settled(jobs, name, counted), 180, 0.2,
             lambda: f"{name}: one {what}, generation 1 running\n{jobs.describe(name)}\n"
             "pods the test's own watch sees: " + ", ".join(
                 f"{e.name} (generation {e.generation}{', deleting' if e.deleting else ''})"
                 for e in recorder.live_pods().values()))


def apiserver_round(rng: random.Random, r: int, control: ControlPlane, jobs: Jobs,
                    recorder: Recorder) -> str:
    name, counted = f"api-{r}", rng.random() < 0.5
    start_job(jobs, name)
    delay = rng.uniform(0, 3.0)
    trigger_restart(jobs, name, counted, rng.randrange(WORKERS))
    time.sleep(delay)  # where in the restart the API server dies is the subject
    seen = describe_phase(jobs, name)
    killed = control.kill("kube-apiserver")
    try:
        time.sleep(rng.uniform(0, 3.0))  # and how long it stays dead
    finally:
        control.restart("kube-apiserver")
    back = time.monotonic()
    wait_settled(jobs, name, counted, recorder)
    done = time.monotonic()
    return (f"round {r}: {'worker exit 1' if counted else 'pod deleted'}, API server "
            f"SIGKILLed {delay:.2f}s later (job then {seen}), down {back - killed:.1f}s "
            f"(restart.sh included); job converged {done - back:.1f}s after it served again")


def test_apiserver_killed_in_the_middle_of_a_group_restart(
    chaos: Chaos, control: ControlPlane, jobs: Jobs, operator: OperatorProcess,
    recorder: Recorder, figures: Figures,
) -> None:
    rng = chaos.rng("apiserver")
    for r in range(chaos.rounds):
        figures(apiserver_round(rng, r, control, jobs, recorder))
    pods, job_events = recorder.snapshot()
    report = check(pods, job_events)
    log = operator_log(operator.log_path)
    figures(f"invariants: {report.figures()}; the test's watch re-listed {len(recorder.gaps)} "
            f"times (gaps {', '.join(f'{b - a:.1f}s' for a, b in recorder.gaps) or 'none'})")
    figures(f"operator log: {log.count('reconcile failed')} failed passes (retried), "
            f"{log.count('watch of')} watch failures, {log.count('Traceback')} tracebacks")
    assert not report.violations, "\n".join(report.violations)


def etcd_round(rng: random.Random, r: int, control: ControlPlane, jobs: Jobs,
               recorder: Recorder) -> str:
    """Even rounds freeze etcd in the middle of a group restart, odd ones while the job just
    runs: afterwards exactly the one restart the test caused, and where nothing was caused,
    the same pods, generation and counts as before."""
    name, mid_restart = f"etcd-{r}", r % 2 == 0
    start_job(jobs, name)
    before = {p["metadata"]["uid"] for p in jobs.pods(name)}
    delay = rng.uniform(0, 2.0)
    if mid_restart:
        fail_worker(jobs, name, rng.randrange(WORKERS))
        time.sleep(delay)  # where in the restart etcd freezes is the subject
    seen = describe_phase(jobs, name)
    paused, resumed = control.freeze("etcd", ETCD_PAUSE_SECONDS)
    if not mid_restart:
        wait_for(lambda: jobs.status(name).get("phase") == "Running", 120, 0.5,
                 lambda: f"{name} running again\n{jobs.describe(name)}")
        status = jobs.status(name)
        assert (status["groupGeneration"], status["restarts"], status["disruptions"]) \
            == (0, 0, 0), jobs.describe(name)
        assert {p["metadata"]["uid"] for p in jobs.pods(name)} == before
        fail_worker(jobs, name, rng.randrange(WORKERS))  # and it still acts on news
    wait_settled(jobs, name, True, recorder)
    done = time.monotonic()
    what = f"{delay:.2f}s into a restart (job then {seen})" if mid_restart else \
        "while the job ran (then a worker failed)"
    return (f"round {r}: etcd SIGSTOPped {what} for {resumed - paused:.1f}s; the job "
            f"converged to exactly one restart {done - resumed:.1f}s after SIGCONT")


def test_etcd_frozen_for_20s(
    chaos: Chaos, control: ControlPlane, jobs: Jobs, operator: OperatorProcess,
    recorder: Recorder, figures: Figures,
) -> None:
    rng = chaos.rng("etcd")
    for r in range(chaos.rounds):
        figures(etcd_round(rng, r, control, jobs, recorder))
    pods, job_events = recorder.snapshot()
    report = check(pods, job_events)
    log = operator_log(operator.log_path)
    figures(f"invariants: {report.figures()}")
    figures(f"operator log: {log.count('reconcile failed')} failed passes (retried), "
            f"{log.count('leader election in')} failed Lease renewals, "
            f"{log.count('Traceback')} tracebacks")
    assert not report.violations, "\n".join(report.violations)


def test_an_api_server_down_25s_restarts_no_job(
    control: ControlPlane, jobs: Jobs, operator: OperatorProcess, figures: Figures,
) -> None:
    """No kubelet can renew its node's Lease while the API server is down, and the operator's
    Lease watch hears nothing until it is back: every node looked lost, and every
    job whose workers cannot veto by answering /progress (plain scripts like these) restarted,
    spending maxDisruptions with a 3 s grace."""
    names = ["quiet-0", "quiet-1"]
    for name in names:
        start_job(jobs, name)
    before = {name: sorted(p["metadata"]["uid"] for p in jobs.pods(name)) for name in names}
    killed = control.kill("kube-apiserver")
    try:
        time.sleep(API_SERVER_DOWN_SECONDS)
    finally:
        control.restart("kube-apiserver")
    back = time.monotonic()
    while time.monotonic() - back < QUIET_WATCH_SECONDS:
        for name in names:
            s = jobs.status(name)
            assert (s.get("groupGeneration"), s.get("restarts"), s.get("disruptions")) == \
                (0, 0, 0), f"{name} restarted after the API server came back\n" + \
                jobs.describe(name)
        time.sleep(1)
    for name in names:
        assert sorted(p["metadata"]["uid"] for p in jobs.pods(name)) == before[name]
        assert jobs.status(name).get("phase") == "Running", jobs.describe(name)
    log = operator_log(operator.log_path)
    figures(f"API server down {back - killed:.1f}s (restart.sh included); "
            f"{QUIET_WATCH_SECONDS:.0f}s watched after: no job restarted; operator log: "
            f"{log.count('watch of')} watch failures, {log.count('Traceback')} tracebacks")
