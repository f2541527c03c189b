"""Two operator instances on one namespace — a second release, a local run for debugging —
never both act: the Lease holder handles the jobs, the other waits and says so, and takes
over when the holder dies, without doubling a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs, generation_of, job
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("images")


@pytest.fixture
def second(namespace: str, tmp_path: Path, chart_env: dict[str, str],
           operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """Another instance on the same namespace, started after the first one."""
    process = OperatorProcess(env=chart_env, namespace=namespace, identity="operator-1",
                              log_path=tmp_path / "operator-1.log")
    process.start()
    yield process
    process.stop()


def creates(op: OperatorProcess) -> float:
    return op.metric("multiworker_api_requests_total", verb="create", resource="pods")


def test_exactly_one_instance_acts_and_the_other_takes_over(
    jobs: Jobs, operator: OperatorProcess, second: OperatorProcess,
) -> None:
    jobs.apply(job("train", "exec sleep 3600", workers=3))
    jobs.wait_running("train")
    leaders = [op for op in (operator, second)
               if op.metric("multiworker_leading_namespaces") == 1]
    assert len(leaders) == 1, "exactly one instance must hold the namespace"
    leader = leaders[0]
    standby = second if leader is operator else operator
    assert creates(leader) == 3 and creates(standby) == 0
    wait_for(lambda: "this instance waits" in standby.log_tail(400), 30,
             describe=lambda: f"the standby to say it waits\n{standby.log_tail()}")

    leader.kill()  # SIGKILL: the Lease is not handed back
    victim = jobs.pods("train")[1]["metadata"]["name"]
    jobs.kubectl("delete", "pod", victim, "--wait=false")
    status = jobs.wait_running("train", generation=1, timeout=90)
    assert (status["disruptions"], status["restarts"]) == (1, 0)  # once, not twice
    assert creates(standby) == 3
    assert {generation_of(p) for p in jobs.pods("train")
            if "deletionTimestamp" not in p["metadata"]} == {1}
