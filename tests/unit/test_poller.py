"""The progress poller against real HTTP servers on loopback: pooled keep-alive connections,
bounded reads of hostile answers, timeouts, the polling rate and when a pass is woken."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from multiworker.clients.poller import (
    MIN_SECONDS,
    JobPolls,
    Poller,
    _news_key,
    asked_workers,
    news,
    poll_interval,
)
from multiworker.decide.progress import BadReport, Report, Targets, parse_report, track

from tests.unit.test_progress import raw

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """A /progress server on 127.0.0.1; yields its port and the peer ports it saw (one per
    TCP connection)."""
    peers: list[int] = []

    async def counting(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername")[1] if request.transport else 0
        if peer not in peers:
            peers.append(peer)
        return await handler(request)

    app = web.Application()
    app.router.add_get("/progress", counting)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, peers
    finally:
        await runner.cleanup()


def poller(**kwargs: Any) -> Poller:
    return Poller(notify=lambda key: None, clock=lambda: datetime.now(UTC), **kwargs)


async def fetch(p: Poller, port: int, times: int = 1) -> list[bytes | None]:
    import aiohttp
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=4), timeout=aiohttp.ClientTimeout(total=p.timeout),
    ) as p._session:
        found: list[bytes | None] = []
        for _ in range(times):
            found += await p.fetch_all([(0, "127.0.0.1")], port)
        return found


def test_reports_come_over_one_kept_alive_connection() -> None:
    async def scenario() -> None:
        async def ok(_: web.Request) -> web.Response:
            return web.json_response(raw(step=7))
        async with server(ok) as (port, peers):
            bodies = await fetch(poller(), port, times=3)
        assert all(isinstance(parse_report(b or b"", 0, 0), Report) for b in bodies)
        assert len(peers) == 1

    asyncio.run(scenario())


def test_a_huge_chunked_answer_is_read_only_so_far() -> None:
    async def scenario() -> None:
        sent = 0

        async def huge(request: web.Request) -> web.StreamResponse:
            nonlocal sent
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            try:
                for _ in range(10_000):  # 640 MB if anyone read it all
                    await response.write(b"[" * 65536)
                    sent += 65536
            except (ConnectionResetError, RuntimeError):
                pass
            return response
        async with server(huge) as (port, _):
            [body] = await fetch(poller(), port)
        assert body is not None and len(body) == 64 * 1024 + 1
        assert isinstance(parse_report(body, 0, 0), BadReport)
        assert sent < 100 * 65536  # the server was cut off, not drained

    asyncio.run(scenario())


def test_a_slow_worker_times_out_as_silent() -> None:
    async def scenario() -> None:
        async def slow(_: web.Request) -> web.Response:
            await asyncio.sleep(5)
            return web.json_response(raw())
        async with server(slow) as (port, _):
            assert await fetch(poller(timeout=0.3), port) == [None]

    asyncio.run(scenario())


@pytest.mark.parametrize(("timeout", "interval"), [
    (None, 10.0), (5, MIN_SECONDS), (30, 6.0), (600, 10.0)])
def test_the_rate_follows_the_hang_timeout(timeout: int | None, interval: float) -> None:
    targets = Targets(0, 8471, ((0, "10.0.0.1"),), True, progress_timeout=timeout)
    assert poll_interval(targets) == interval


def test_the_loop_polls_a_job_and_wakes_its_pass_on_news() -> None:
    async def scenario() -> None:
        steps = iter(range(0, 1000, 10))

        async def training(request: web.Request) -> web.Response:
            return web.Response(body=json.dumps(raw(step=next(steps))).encode(),
                                content_type="application/json")
        woken: list[str] = []
        p = Poller(notify=woken.append, clock=lambda: datetime.now(UTC), status_seconds=0.2)
        async with server(training) as (port, _):
            task = asyncio.create_task(p.run())
            p.after_pass("job", Targets(0, port, ((0, "127.0.0.1"),), True), datetime.now(UTC))
            for _ in range(100):
                if woken:
                    break
                await asyncio.sleep(0.05)
            task.cancel()
        assert woken[:1] == ["job"]  # the group's first report is news at once
        health = p.health("job")
        assert health is not None and health.workers[0].report is not None

    asyncio.run(scenario())


def test_a_group_nobody_answered_is_asked_through_its_chief_until_someone_answers() -> None:
    targets = Targets(0, 8471, ((0, "10.0.0.1"), (1, "10.0.0.2"), (2, "10.0.0.3")), True)
    now = datetime.now(UTC)
    assert asked_workers(targets, None) == ((0, "10.0.0.1"),)
    silent = track(None, targets, {0: None}, now)
    assert asked_workers(targets, silent) == ((0, "10.0.0.1"),)
    unreadable = track(silent, targets, {0: BadReport("not JSON")}, now)
    assert asked_workers(targets, unreadable) == targets.workers  # it answers: ask everyone
    without_chief = Targets(0, 8471, ((1, "10.0.0.2"), (2, "10.0.0.3")), False)
    assert asked_workers(without_chief, None) == without_chief.workers


def test_a_worker_that_stops_answering_is_news_at_once() -> None:
    """A silent node's Lease is explained away only while its workers answer: the pass must
    look as soon as one stops, and again when it misses a second poll in a row (a worker that
    never answered yet is no news)."""
    targets = Targets(0, 8471, ((0, "10.0.0.1"), (1, "10.0.0.2")), True)
    now = datetime.now(UTC)

    def report(index: int, step: int) -> Report | BadReport:
        return parse_report(json.dumps(raw(index=index, step=step)).encode(), index, 0)
    both = track(None, targets, {0: report(0, 5), 1: report(1, 5)}, now)
    polls = JobPolls(targets, due=0.0, health=both)
    polls.seen = (*_news_key(polls), now)
    assert not news(polls)
    polls.health = track(both, targets, {0: report(0, 5), 1: None}, now)
    assert news(polls)
    polls.seen = (*_news_key(polls), now)
    # The second miss in a row ends the veto: news too; a third is not.
    polls.health = track(polls.health, targets, {0: report(0, 5), 1: None}, now)
    assert news(polls)
    polls.seen = (*_news_key(polls), now)
    polls.health = track(polls.health, targets, {0: report(0, 5), 1: None}, now)
    assert not news(polls)
    starting = track(None, targets, {0: report(0, 5), 1: None}, now)
    polls = JobPolls(targets, due=0.0, health=starting)
    polls.seen = (*_news_key(polls), now)
    polls.health = track(starting, targets, {0: report(0, 5), 1: None}, now)
    assert not news(polls)


def test_a_paused_job_keeps_what_is_known_of_its_workers_and_resumes_with_the_next_pass() -> None:
    """A lapse of the Lease paused polling; forgetting instead made a worker that stopped in
    the lapse look like one that never answered, whose hang nobody could call (chaos
    test_lease_hiccup, seen)."""
    async def scenario() -> None:
        steps = iter(range(0, 1000, 10))

        async def training(request: web.Request) -> web.Response:
            return web.Response(body=json.dumps(raw(step=next(steps))).encode(),
                                content_type="application/json")
        p = Poller(notify=lambda key: None, clock=lambda: datetime.now(UTC), status_seconds=0.2)
        async with server(training) as (port, _):
            task = asyncio.create_task(p.run())
            targets = Targets(0, port, ((0, "127.0.0.1"),), True)
            p.after_pass("job", targets, datetime.now(UTC))
            for _ in range(100):
                if (h := p.health("job")) is not None and h.workers[0].report is not None:
                    break
                await asyncio.sleep(0.05)
            p.pause("job")
            await asyncio.sleep(0.3)  # let a poll in flight finish
            known = p.health("job")
            assert known is not None and known.workers[0].report is not None
            step = known.workers[0].report.step
            await asyncio.sleep(0.6)  # three intervals: no poll while paused
            assert p.health("job") is known  # nothing asked, nothing forgotten
            p.after_pass("job", targets, datetime.now(UTC))  # the next pass resumes it
            for _ in range(100):
                h = p.health("job")
                if h is not None and h.workers[0].report is not None \
                        and h.workers[0].report.step > step:
                    break
                await asyncio.sleep(0.05)
            task.cancel()
        resumed = p.health("job")
        assert resumed is not None and resumed.workers[0].report is not None
        assert resumed.workers[0].report.step > step

    asyncio.run(scenario())
