"""Leader election: the pure rule, and two candidates against one in-memory Lease API."""

from __future__ import annotations

import asyncio
import copy
import threading
from datetime import UTC, datetime
from typing import Any

from multiworker.clients.leader import Elector, Move, Sighting, decide

Manifest = dict[str, Any]


def lease(holder: str | None, version: str = "1", duration: int = 15) -> Manifest:
    return {"metadata": {"name": "multiworker-operator", "namespace": "ns",
                         "resourceVersion": version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "renewTime": f"t{version}"}}


def test_decide() -> None:
    assert decide(None, "me", None, 0)[0] is Move.CREATE
    assert decide(lease("me"), "me", None, 0)[0] is Move.RENEW
    assert decide(lease(None), "me", None, 0)[0] is Move.TAKE_OVER
    move, seen = decide(lease("other"), "me", None, 100)
    assert move is Move.FOLLOW and seen == Sighting(("other", "t1", "1"), 100)
    # The record did not change for the lease duration, by our own clock: take over.
    assert decide(lease("other"), "me", seen, 114)[0] is Move.FOLLOW
    assert decide(lease("other"), "me", seen, 115)[0] is Move.TAKE_OVER
    # A renewal (a new record) restarts the wait, whatever the holder's clock says.
    move, newer = decide(lease("other", version="2"), "me", seen, 114)
    assert move is Move.FOLLOW and newer is not None and newer.changed_at == 114


class LeaseAPI:
    """Leases with optimistic concurrency, as the API server keeps them."""

    def __init__(self) -> None:
        self.leases: dict[str, Manifest] = {}
        self.version = 0
        self.down = False
        self.during_put: Any = None  # called while a PUT is in flight (a slow etcd)

    def _stored(self, lease: Manifest) -> Manifest:
        self.version += 1
        stored = copy.deepcopy(lease)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[lease["metadata"]["namespace"]] = stored
        return copy.deepcopy(stored)

    def get_lease(self, namespace: str, name: str) -> Manifest | None:
        if self.down:
            raise ConnectionError("api server down")
        return copy.deepcopy(self.leases.get(namespace))

    def create_lease(self, lease: Manifest) -> Manifest | None:
        if lease["metadata"]["namespace"] in self.leases:
            return None
        return self._stored(lease)

    def replace_lease(self, lease: Manifest) -> Manifest | None:
        if self.down:
            raise ConnectionError("api server down")
        if self.during_put is not None:
            self.during_put()
        current = self.leases.get(lease["metadata"]["namespace"])
        if current is None or current["metadata"]["resourceVersion"] != \
                lease["metadata"].get("resourceVersion"):
            return None
        return self._stored(lease)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def electors(api: LeaseAPI, clock: Clock) -> tuple[Elector, Elector, list[tuple[str, str, bool]]]:
    changes: list[tuple[str, str, bool]] = []
    wall = lambda: datetime(2026, 1, 1, tzinfo=UTC)
    a = Elector(api, "a", lambda ns, on: changes.append(("a", ns, on)), clock=clock,  # type: ignore[arg-type]
                wall=wall)
    b = Elector(api, "b", lambda ns, on: changes.append(("b", ns, on)), clock=clock,  # type: ignore[arg-type]
                wall=wall)
    a.want({"ns"})
    b.want({"ns"})
    return a, b, changes


def test_exactly_one_leads_and_the_other_takes_over_after_the_duration() -> None:
    api, clock = LeaseAPI(), Clock()
    a, b, changes = electors(api, clock)
    a.step("ns")
    b.step("ns")
    assert a.leads("ns") and not b.leads("ns") and changes == [("a", "ns", True)]
    assert api.leases["ns"]["spec"]["holderIdentity"] == "a"
    for _ in range(3):  # a renews every 5 s; b keeps seeing new records
        clock.t += 5
        a.step("ns")
        b.step("ns")
        assert a.leads("ns") and not b.leads("ns")
    clock.t += 14  # a died (SIGKILL): no more renewals
    b.step("ns")
    assert not b.leads("ns")
    clock.t += 1  # 15 s since b last saw the record change
    b.step("ns")
    assert b.leads("ns") and changes[-1] == ("b", "ns", True)
    assert api.leases["ns"]["spec"]["leaseTransitions"] == 1


def test_a_holder_that_cannot_renew_stops_acting_before_anyone_can_take_over() -> None:
    api, clock = LeaseAPI(), Clock()
    a, _, changes = electors(api, clock)
    a.step("ns")
    api.down = True
    clock.t += 9
    a.step("ns")
    assert a.leads("ns")
    clock.t += 1  # 10 s (the deadline) without a renewal; others wait 15 s
    a.step("ns")
    assert not a.leads("ns") and changes[-1] == ("a", "ns", False)


def test_release_hands_the_lease_over_at_once() -> None:
    api, clock = LeaseAPI(), Clock()
    a, b, _ = electors(api, clock)
    a.step("ns")
    b.step("ns")
    import asyncio
    asyncio.run(a.release_all())
    assert api.leases["ns"]["spec"]["holderIdentity"] is None
    b.step("ns")
    assert b.leads("ns")


def test_a_namespace_without_jobs_is_let_go() -> None:
    api, clock = LeaseAPI(), Clock()
    a, _, changes = electors(api, clock)
    a.step("ns")
    a.want(set())
    a.step("ns")
    assert not a.leads("ns") and api.leases["ns"]["spec"]["holderIdentity"] is None
    assert changes[-1] == ("a", "ns", False)


def test_a_renewal_that_returns_late_announces_the_lapse_and_the_new_start() -> None:
    """etcd stalls 12 s under a renewal PUT that then succeeds: a pass in the gap sees no
    leadership (it is skipped, and the lapse announced); the late renewal announces leading
    again, so the controller requeues every job of the namespace instead of leaving them
    without a timer."""
    api, clock = LeaseAPI(), Clock()
    a, _, changes = electors(api, clock)
    a.step("ns")
    seen_in_the_gap: list[bool] = []

    def stall() -> None:
        clock.t += 12
        seen_in_the_gap.append(a.leads("ns"))  # a pass runs meanwhile

    api.during_put = stall
    clock.t += 5
    a.step("ns")
    assert seen_in_the_gap == [False]
    assert a.leads("ns")
    assert changes == [("a", "ns", True), ("a", "ns", False), ("a", "ns", True)]


def test_namespaces_renew_at_once_so_one_slow_namespace_delays_no_other() -> None:
    """Rounds ran one namespace after another: ~100 namespaces x 45 ms left a gap every
    cycle, and one slow call held all the others back."""
    api, clock = LeaseAPI(), Clock()
    a = Elector(api, "a", lambda ns, on: None, clock=clock,  # type: ignore[arg-type]
                wall=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    a.want({"first", "second"})
    a.step("first")
    a.step("second")
    second_renewed = threading.Event()
    seen: list[bool] = []

    def renewal() -> None:
        if threading.current_thread().name == "first-put":
            seen.append(second_renewed.wait(5))  # held until the other namespace renews
        else:
            second_renewed.set()

    original = api.replace_lease

    def replace(lease: Manifest) -> Manifest | None:
        threading.current_thread().name = f"{lease['metadata']['namespace']}-put"
        renewal()
        return original(lease)

    api.replace_lease = replace  # type: ignore[method-assign]

    async def one_round() -> None:
        task = asyncio.create_task(a.run())
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(one_round())
    assert seen == [True]


def test_a_late_renewal_is_a_lapse_even_when_no_pass_asked_meanwhile() -> None:
    """Nothing called leads() while the renewal hung (every pass was blocked too): the renewal
    that comes back past the deadline still says so, and starts over."""
    api, clock = LeaseAPI(), Clock()
    a, _, changes = electors(api, clock)
    a.step("ns")

    def stall() -> None:
        clock.t += 12

    api.during_put = stall
    clock.t += 5
    a.step("ns")
    assert a.leads("ns")
    assert changes == [("a", "ns", True), ("a", "ns", False), ("a", "ns", True)]
