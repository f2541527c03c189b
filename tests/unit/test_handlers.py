"""The per-job loops: started by events, woken by pods, stopped by deletion, errors retried."""

from __future__ import annotations

import asyncio
from typing import Any

from multiworker.handlers import JobLoops, PeeringFollower, operator_settings
from multiworker.peering import Peering
from multiworker.watch import ProgressWatch

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


class Workers:
    """GET /progress answered by fake workers: `step` grows by 10 per poll."""

    def __init__(self) -> None:
        self.step = 0
        self.polls = 0

    async def fetch(self, workers: Any, port: int) -> dict[int, Any]:
        self.polls += 1
        self.step += 10
        return {i: {"workerIndex": i, "generation": 0, "phase": "training", "step": self.step,
                    "lastCheckpointStep": 10, "updatedAt": 1767268800.0} for i, _ in workers}


def test_loop_polls_progress_between_passes_and_writes_it() -> None:
    async def scenario() -> None:
        cluster, workers = FakeCluster(job_body()), Workers()
        loops = JobLoops(cluster, clock=lambda: cluster.now, resync_seconds=60,
                         new_watch=lambda: ProgressWatch(workers.fetch, 0.01, write_seconds=0))
        loops.ensure(KEY)
        await until(lambda: len(cluster.pods) == 3)
        cluster.run()
        loops.wake(KEY)
        await until(lambda: (cluster.status.get("progress") or {}).get("step"))
        assert cluster.status["progress"]["lastCheckpointStep"] == 10
        await loops.stop_all()

    asyncio.run(scenario())


def test_paused_loops_neither_reconcile_nor_poll() -> None:
    async def scenario() -> None:
        cluster, workers = FakeCluster(job_body()), Workers()
        loops = JobLoops(cluster, clock=lambda: cluster.now, resync_seconds=60,
                         new_watch=lambda: ProgressWatch(workers.fetch, 0.01, write_seconds=0))
        loops.ensure(KEY)
        await until(lambda: len(cluster.pods) == 3)
        cluster.run()
        loops.pause(True)
        loops.wake(KEY)
        await asyncio.sleep(0.2)
        assert cluster.status.get("phase") == "Pending" and workers.polls <= 1
        loops.pause(False)
        await until(lambda: cluster.status.get("phase") == "Running")
        await until(lambda: workers.polls > 2)
        await loops.stop_all()

    asyncio.run(scenario())


class Peerings(FakeCluster):
    def __init__(self, status: dict[str, Any] | None) -> None:
        super().__init__(job_body())
        self.peering = None if status is None else {"status": status}

    def get_peering(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == ("ml", "mwo")
        return self.peering


def test_peering_follower_pauses_while_outranked() -> None:
    async def scenario() -> None:
        cluster = Peerings({"me": {"priority": 5}, "other": {"priority": 9}})
        loops = JobLoops(cluster)
        me = Peering("mwo", False, ("ml",), "me", 5)
        follower = PeeringFollower(cluster, me, loops)  # type: ignore[arg-type]
        await follower.look()
        assert loops.paused
        cluster.peering = {"status": {"me": {"priority": 5}, "other": {"priority": 1}}}
        await follower.look()
        assert not loops.paused

    asyncio.run(scenario())
