"""Two operator replicas (distinct --identity) on one namespace; the leader is SIGKILLed during a
group restart. The other must take the Lease over — within the Lease duration (15 s) after the
last renewal it saw, plus one renew interval (5 s) to notice — and finish the restart exactly
once. Measured here: SIGKILL to the Lease changing hands, and to the new group running."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures
from tests.chaos.invariants import check
from tests.chaos.recorder import Recorder
from tests.chaos.rest import Rest
from tests.chaos.workers import fail_worker, real_job, running_generation
from tests.cluster import Cluster
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs
from tests.support import alone, wait_for

pytestmark = [pytest.mark.usefixtures("images"), pytest.mark.timeout(900),
              alone("no other operator may run (chaos/conftest.py `alone`), and it times a takeover")]

WORKERS = 3
LEASE = "multiworker-operator"
LEASE_SECONDS, RENEW_SECONDS = 15, 5  # leader.py
# Longest takeover the rule allows: the last renewal just before the kill, seen up to one
# (jittered) renew interval late, then the whole duration by the candidate's own clock.
TAKEOVER_BOUND = LEASE_SECONDS + 2 * RENEW_SECONDS


@pytest.fixture
def replicas(namespace: str, tmp_path: Path, chart_env: dict[str, str],
             operator: OperatorProcess) -> Iterator[list[OperatorProcess]]:
    second = OperatorProcess(env=chart_env, namespace=namespace, identity="operator-1",
                             log_path=tmp_path / "operator-1.log")
    second.start()
    yield [operator, second]
    second.stop()


def holder(rest: Rest, namespace: str) -> str:
    answer = rest.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                                 f"{LEASE}")
    return str((answer.body.get("spec") or {}).get("holderIdentity") or "") if answer.ok else ""


def leader_of(replicas: list[OperatorProcess], rest: Rest, namespace: str
              ) -> OperatorProcess | None:
    held = holder(rest, namespace)
    return next((op for op in replicas if op.identity == held
                 and op.metric("multiworker_leading_namespaces") == 1), None)


def failover_round(rng: random.Random, r: int, replicas: list[OperatorProcess], rest: Rest,
                   jobs: Jobs, name: str) -> str:
    ns = jobs.namespace
    wait_for(lambda: running_generation(jobs, name, WORKERS, r), 120, 0.2,
             lambda: f"generation {r} running\n{jobs.describe(name)}")
    leader = wait_for(lambda: leader_of(replicas, rest, ns), 60, 0.2, "one replica to lead")
    standby = next(op for op in replicas if op is not leader)
    delay = rng.uniform(0, 3.0)
    fail_worker(jobs, name, rng.randrange(WORKERS))
    time.sleep(delay)  # where in the restart the leader dies is the subject
    status = jobs.status(name)
    leader.kill()
    killed = time.monotonic()
    wait_for(lambda: holder(rest, ns) == standby.identity, TAKEOVER_BOUND + 10, 0.1,
             f"{standby.identity} to take the Lease over within the Lease rule's bound")
    took_over = time.monotonic() - killed
    final = wait_for(lambda: running_generation(jobs, name, WORKERS, r + 1), 120, 0.1,
                     lambda: f"generation {r + 1} running\n{jobs.describe(name)}")
    restarted = time.monotonic() - killed
    assert (final["restarts"], final["disruptions"]) == (r + 1, 0), jobs.describe(name)
    leader.start()  # back, as the standby of the next round
    return (f"round {r}: {leader.identity} SIGKILLed {delay:.2f}s after a worker exited 1 "
            f"(job then {status.get('phase')}/generation {status.get('groupGeneration')}); "
            f"{standby.identity} held the Lease {took_over:.1f}s later (rule's bound "
            f"{TAKEOVER_BOUND}s); generation {r + 1} running {restarted:.1f}s after the kill")


def test_leader_killed_during_a_restart_hands_over_once(
    chaos: Chaos, cluster: Cluster, jobs: Jobs, replicas: list[OperatorProcess],
    recorder: Recorder, figures: Figures,
) -> None:
    rng = chaos.rng("leader")
    rest = Rest(cluster.api_client())
    name = "lead"
    jobs.apply(real_job(name, restartPolicy={"backoffSeconds": 2, "maxRestarts": 10}))
    for r in range(chaos.rounds):
        figures(failover_round(rng, r, replicas, rest, jobs, name))
    pods, job_events = recorder.snapshot()
    report = check(pods, job_events)
    figures(f"invariants: {report.figures()}")
    assert not report.violations, "\n".join(report.violations)
    assert list(report.generations.values()) == [chaos.rounds + 1]
