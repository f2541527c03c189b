"""The work queue: one entry per key, never two passes of one key at once, delayed adds."""

from __future__ import annotations

import asyncio

import uvloop
from multiworker.clients.workqueue import WorkQueue, jittered


def run(coro: object) -> None:
    """On the operator's loop (cli.py)."""
    uvloop.run(coro)  # type: ignore[arg-type]


def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        for key in ("a", "b", "a", "a"):
            q.add(key)
        assert [await q.get(), await q.get()] == ["a", "b"] and len(q) == 0

    run(scenario())


def test_a_key_added_during_its_pass_is_handed_out_only_after_done() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("job")
        assert await q.get() == "job"
        q.add("job")  # an event while the pass runs
        q.add("other")
        assert await q.get() == "other"  # never "job" twice at once
        getting = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        assert not getting.done()
        q.done("job")
        assert await asyncio.wait_for(getting, 1) == "job"

    run(scenario())


def test_delayed_adds_keep_the_earliest_time_and_an_add_now_wins() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        q.add_after("late", 0.2)
        q.add_after("late", 5)  # later than what is pending: ignored
        q.add_after("soon", 0.05)
        assert await q.get() == "soon"
        assert await q.get() == "late"
        assert 0.15 < loop.time() - start < 2
        q.done("late")
        q.add_after("x", 10)
        q.add("x")
        assert await asyncio.wait_for(q.get(), 1) == "x"
        q.done("x")
        assert len(q) == 0  # the pending timer went with the immediate add

    run(scenario())


def test_timers_due_within_the_loops_resolution_still_order_later_ones() -> None:
    async def scenario() -> None:
        # uvloop's call_at answers a timer already due (under its 1 ms clock) with a plain
        # Handle, which has no when(): the queue keeps the alarm's time itself.
        q: WorkQueue[str] = WorkQueue()
        q.add_after("first", 0.0001)
        q.add_after("sooner", 0.00005)
        q.add_after("later", 0.05)
        assert {await q.get(), await q.get()} == {"first", "sooner"}
        assert await asyncio.wait_for(q.get(), 1) == "later"

    run(scenario())


def test_jitter_spreads_within_bounds() -> None:
    values = {round(jittered(100), 3) for _ in range(50)}
    assert len(values) > 10 and all(90 <= v <= 110 for v in values)


def test_a_delayed_add_of_a_queued_key_adds_no_second_pass() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("job")
        q.add_after("job", 0.05)  # its pass comes first, and sets its own timers
        assert await q.get() == "job"
        q.done("job")
        assert len(q) == 0

    run(scenario())


def test_a_key_wakes_one_waiting_worker_not_the_herd() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        got: list[str] = []

        async def worker() -> None:
            got.append(await q.get())

        workers = [asyncio.create_task(worker()) for _ in range(8)]
        await asyncio.sleep(0.01)
        q.add("job")
        await asyncio.sleep(0.01)
        assert got == ["job"] and sum(w.done() for w in workers) == 1
        assert len(q._waiters) == 7  # the others still wait; none was woken to find nothing
        q.add_after("later", 0.02)
        await asyncio.sleep(0.1)
        assert got == ["job", "later"]  # a timer wakes a worker too, with no add to follow
        for w in workers:
            w.cancel()

    run(scenario())


def test_a_worker_cancelled_as_it_is_woken_passes_the_key_on() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue()
        first = asyncio.create_task(q.get())
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        q.add("job")  # wakes `first`...
        first.cancel()  # ...which is cancelled before it runs
        assert await asyncio.wait_for(second, 1) == "job"

    run(scenario())
