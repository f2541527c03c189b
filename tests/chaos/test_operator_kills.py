"""The operator SIGKILLed at seeded random instants while jobs of 3-8 workers are created,
restarted, disrupted, suspended, resumed, finished and deleted (scenario.py).

Pods live on kwok fake nodes (kwok.py): the operator only ever sees API objects, and real
containers for hundreds of pods would cost the 2 shared cores minutes per run; the
control-plane and leader cases use real pods on the real node instead. A kill lands a seeded
0-1 s after an action (before, during or after the operator's reaction to it), the operator
stays down a seeded 0-1 s, and the next action waits until the job shows exactly what its
steps so far imply. Invariants (invariants.py) are checked over the test's own pod watch.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures, operator_log
from tests.chaos.invariants import check, leftovers
from tests.chaos.kwok import CUT_AFTER_SECONDS, exit_worker, finish_deletion, kwok_job
from tests.chaos.recorder import Recorder
from tests.chaos.rest import MERGE, Rest, apply, jobs_path, pods_path
from tests.chaos.scenario import (
    Action,
    JobPlan,
    Step,
    interleave,
    plan_jobs,
    schedule_kills,
)
from tests.cluster import Cluster
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs, condition
from tests.support import wait_for

pytestmark = [pytest.mark.usefixtures("images", "fake_nodes"), pytest.mark.timeout(1800)]

TERMINAL = ("Succeeded", "Failed")


class Driver:
    """Carries out actions on the jobs and waits for what they imply."""

    def __init__(self, cluster: Cluster, jobs: Jobs, plans: list[JobPlan],
                 recorder: Recorder) -> None:
        self.rest = Rest(cluster.api_client())
        self.jobs, self.ns, self.recorder = jobs, jobs.namespace, recorder
        self.plans = {p.name: p for p in plans}
        self.finished_cut: set[str] = set()  # uids of pods whose deletion a kill cut in half

    def perform(self, action: Action) -> None:
        plan, pod = self.plans[action.job], f"{action.job}-worker-{action.worker}"
        step = action.step
        if step is Step.CREATE:
            manifest = kwok_job(plan.name, plan.workers, restartPolicy={
                "maxRestarts": plan.max_restarts, "backoffSeconds": 1, "maxBackoffSeconds": 2})
            answer = apply(self.rest, self.ns, manifest)
            assert answer.ok, answer.message
        elif step in (Step.FAIL, Step.EXHAUST):
            exit_worker(self.rest, self.ns, pod, 1)
        elif step is Step.SUCCEED:
            exit_worker(self.rest, self.ns, pod, 0)
        elif step is Step.DISRUPT:
            self.rest.call("DELETE", pods_path(self.ns, pod))
        elif step in (Step.SUSPEND, Step.RESUME):
            self.rest.call("PATCH", jobs_path(self.ns, plan.name),
                           {"spec": {"suspend": step is Step.SUSPEND}}, content_type=MERGE)
        else:
            self.rest.call("DELETE", jobs_path(self.ns, plan.name))

    def reached(self, action: Action) -> bool:
        expect, name = action.expect, action.job
        if expect.phase is None:
            return self.jobs.get(name) is None
        s = self.jobs.status(name)
        if (s.get("phase"), s.get("groupGeneration"), s.get("restarts"),
                s.get("disruptions")) != (expect.phase, expect.generation, expect.restarts,
                                          expect.disruptions):
            return False
        workers = self.plans[name].workers
        if expect.phase == "Running":
            return bool(s.get("ready") == f"{workers}/{workers}")
        if expect.phase in TERMINAL:
            done = condition(s, expect.phase)
            return done is not None and done["reason"] == expect.reason and \
                not self.running_pods(name)
        return not self.running_pods(name)  # Suspended: no pod left running

    def running_pods(self, job: str) -> list[str]:
        return [e.name for e in self.recorder.live_pods().values()
                if e.name.startswith(f"{job}-worker-") and not e.deleting
                and e.phase not in TERMINAL]

    def finish_cut_deletions(self) -> None:
        """Pods terminating for longer than a kubelet takes: their deletion was cut by a kill
        (kwok.finish_deletion)."""
        now = time.monotonic()
        for pod in self.recorder.live_pods().values():
            if pod.deleting and now - pod.at > CUT_AFTER_SECONDS and \
                    pod.uid not in self.finished_cut and \
                    finish_deletion(self.rest, self.ns, pod.name, pod.uid):
                self.finished_cut.add(pod.uid)

    def wait(self, action: Action, timeout: float = 120) -> None:
        def reached() -> bool:
            self.finish_cut_deletions()
            return self.reached(action)
        wait_for(reached, timeout, 0.1,
                 lambda: f"{action.job} after {action.step} to show {action.expect}\n"
                 f"{self.jobs.describe(action.job)}")


def test_operator_sigkilled_at_random_instants(
    chaos: Chaos, cluster: Cluster, jobs: Jobs, operator: OperatorProcess, recorder: Recorder,
    figures: Figures,
) -> None:
    rng = chaos.rng("operator-kills")
    plans = plan_jobs(rng, chaos.jobs)
    actions = interleave(rng, plans)
    kills = schedule_kills(rng, len(actions), chaos.kills)
    driver = Driver(cluster, jobs, plans, recorder)
    starts: list[float] = []
    settles: dict[Step, list[float]] = {}
    killed_in: Counter[Step] = Counter()
    for action, count in zip(actions, kills, strict=True):
        acted = time.monotonic()
        driver.perform(action)
        for _ in range(count):
            time.sleep(rng.uniform(0, 1.0))  # the instant of the kill is the subject
            operator.kill()
            killed_in[action.step] += 1
            time.sleep(rng.uniform(0, 1.0))  # and so is how long nobody watches
            started = time.monotonic()
            operator.start()
            starts.append(time.monotonic() - started)
        driver.wait(action)
        settles.setdefault(action.step, []).append(time.monotonic() - acted)

    for plan in plans:  # finished jobs go too; their pods must follow
        if jobs.get(plan.name) is not None:
            driver.rest.call("DELETE", jobs_path(jobs.namespace, plan.name))
    def all_gone() -> bool:
        driver.finish_cut_deletions()
        return not recorder.live_pods() and not recorder.live_jobs()
    wait_for(all_gone, 120, 0.2,
             lambda: "every pod to go with its job: " + "; ".join(
                 leftovers(recorder.live_pods().values(), recorder.live_jobs())))
    pods, job_events = recorder.snapshot()
    report = check(pods, job_events)
    log = operator_log(operator.log_path)

    figures(f"seed {chaos.seed}: {len(plans)} jobs of "
            f"{', '.join(str(p.workers) for p in plans)} workers, {len(actions)} actions, "
            f"{sum(kills)} SIGKILLs of the operator")
    figures("kills by the action they followed: " + ", ".join(
        f"{step} {n}" for step, n in sorted(killed_in.items())))
    figures(f"operator restart to healthy: median {statistics.median(starts):.2f}s, "
            f"max {max(starts):.2f}s")
    figures("action to expected status, kills and restarts included, median/max: " + ", ".join(
        f"{step} {statistics.median(t):.1f}/{max(t):.1f}s" for step, t in sorted(
            settles.items())))
    figures(f"deletions cut by a kill and finished as a kubelet would: "
            f"{len(driver.finished_cut)}")
    figures(f"invariants: {report.figures()}")
    figures(f"operator log: {log.count('reconcile failed')} failed passes (retried), "
            f"{log.count('Traceback')} tracebacks")
    assert not report.violations, "\n".join(report.violations)
