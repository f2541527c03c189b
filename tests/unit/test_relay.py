"""Informer threads hand events to the loop in order, in batches (clients/relay.py)."""

from __future__ import annotations

import asyncio
import threading

from multiworker.clients.relay import LoopRelay


def test_events_from_threads_arrive_in_order_with_fewer_wakeups_than_events() -> None:
    async def scenario() -> None:
        relay = LoopRelay(asyncio.get_running_loop())
        seen: list[tuple[str, int]] = []
        pods = relay.to(lambda kind, old, new: seen.append(("pod", (new or {})["n"])))
        nodes = relay.to(lambda kind, old, new: seen.append(("node", (new or {})["n"])))

        def informer() -> None:
            for n in range(2000):
                (pods if n % 3 else nodes)("MODIFIED", None, {"n": n})

        thread = threading.Thread(target=informer)
        thread.start()
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0.05)
        assert [n for _, n in seen] == list(range(2000))  # one order across listeners
        assert all(kind == ("pod" if n % 3 else "node") for kind, n in seen)
        assert 1 <= relay.wakeups < 2000

    asyncio.run(scenario())
