"""The per-job loops: started by events, woken by pods, stopped by deletion, errors retried."""

from __future__ import annotations

import asyncio
from typing import Any

from multiworker.handlers import JobLoops, operator_settings

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.fake_cluster import FakeCluster

KEY = (NAMESPACE, "demo")


async def until(predicate: Any, timeout: float = 5) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def test_loop_reconciles_on_start_and_on_wake_and_stops() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(job_body())
        loops = JobLoops(cluster, clock=lambda: cluster.now, resync_seconds=60)
        loops.ensure(KEY)
        await until(lambda: len(cluster.pods) == 3)
        cluster.run()
        loops.wake(KEY)  # what a pod event does
        await until(lambda: cluster.status.get("phase") == "Running")
        await loops.stop(KEY)
        assert loops.tasks == {} and loops.wakeups == {}

    asyncio.run(scenario())


def test_loop_ends_when_the_job_is_gone() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(job_body())
        cluster.job = None
        loops = JobLoops(cluster, clock=lambda: cluster.now)
        loops.ensure(KEY)
        await until(lambda: not loops.tasks)

    asyncio.run(scenario())


class Flaky(FakeCluster):
    """Lists of pods fail a few times, as an overloaded API server would."""

    def __init__(self, failures: int) -> None:
        super().__init__(job_body())
        self.failures = failures

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("api server unavailable")
        return super().list_pods(namespace, job)


def test_errors_are_reported_once_and_retried() -> None:
    async def scenario() -> None:
        cluster = Flaky(failures=2)
        loops = JobLoops(cluster, clock=lambda: cluster.now, error_backoff_seconds=0.01)
        loops.ensure(KEY)
        await until(lambda: len(cluster.pods) == 3)
        await loops.stop_all()
        warnings = [e for e in cluster.events if e[1] == "ReconcileError"]
        assert len(warnings) == 1 and "api server unavailable" in warnings[0][2]

    asyncio.run(scenario())


def test_kopf_bookkeeping_lives_under_our_prefix() -> None:
    settings = operator_settings()
    assert settings.persistence.finalizer == "multiworker.dev/finalizer"
    assert settings.posting.enabled is False
