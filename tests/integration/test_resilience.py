"""The operator can die at any instant (SIGKILL) and, restarted, converges: no duplicate or
orphaned pods, no restart counted twice. Its state lives in the cluster, not in memory."""

from __future__ import annotations

import pytest

from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs, fail_once, generation_of, job
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("images")


def assert_one_clean_group(jobs: Jobs, name: str, workers: int, generation: int) -> None:
    pods = [p for p in jobs.pods(name) if "deletionTimestamp" not in p["metadata"]]
    assert [p["metadata"]["name"] for p in pods] == [f"{name}-worker-{i}" for i in range(workers)]
    assert {generation_of(p) for p in pods} == {generation}
    job_uid = jobs.get(name)["metadata"]["uid"]  # type: ignore[index]
    for pod in pods:
        assert [o["uid"] for o in pod["metadata"]["ownerReferences"]] == [job_uid]


def test_killed_while_creating_the_group(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.apply(job("train", "exec sleep 3600", workers=4))
    wait_for(lambda: jobs.pods("train"), 60, describe="the first worker pod")
    operator.kill()
    operator.start()
    jobs.wait_running("train")
    assert_one_clean_group(jobs, "train", 4, generation=0)


def test_killed_while_restarting(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.apply(job("train", fail_once(index=0, code=1), workers=3,
                   restartPolicy={"backoffSeconds": 3}))
    jobs.wait_phase("train", "Restarting")
    operator.kill()
    operator.start()
    status = jobs.wait_running("train", generation=1)
    assert status["restarts"] == 1  # counted once, although the operator died mid-restart
    assert_one_clean_group(jobs, "train", 3, generation=1)


def test_failure_while_the_operator_is_down(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.apply(job("train", fail_once(index=2, code=1, after=3), workers=3,
                   restartPolicy={"backoffSeconds": 0}))
    jobs.wait_running("train")
    operator.kill()
    wait_for(lambda: any(p["status"].get("phase") == "Failed" for p in jobs.pods("train")),
             60, describe="worker-2 to fail while nobody watches")
    operator.start()
    status = jobs.wait_running("train", generation=1)
    assert status["restarts"] == 1 and status["lastFailure"]["worker"] == 2
    assert_one_clean_group(jobs, "train", 3, generation=1)
