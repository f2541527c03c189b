"""Node heartbeats timed by the operator's clock as their Lease events arrive."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.clients.heartbeats import Heartbeats, slim_lease
from multiworker.decide.nodes import full_disruption, mass_silence_since


def lease(node: str, renewed: str, version: str = "1") -> dict[str, Any]:
    return slim_lease({"metadata": {"name": node, "namespace": "kube-node-lease",
                                    "resourceVersion": version, "managedFields": [{}]},
                       "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                                "renewTime": renewed}})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def advance(beats: Heartbeats, clock: Clock, seconds: float) -> None:
    """`seconds` pass, and two other nodes renew meanwhile (one node alone silent is a lost
    node; every node silent at once is not: test_a_mass_silence_is_many_nodes_silent_at_once)."""
    end = clock.now + seconds
    while True:
        clock.now = min(end, clock.now + 5)  # they renew every 10 s, at least
        for node in ("x", "y"):
            beats.on_lease("MODIFIED", None, lease(node, str(clock.now)))
        if clock.now >= end:
            return


def test_silence_runs_from_the_last_renewal_seen_arriving_not_from_renew_time() -> None:
    clock = Clock()
    beats = Heartbeats(clock)
    advance(beats, clock, 0)
    assert beats.silence("a") is None  # no Lease: nothing known, never "silent"
    # Listed at start: renewed as far as the operator knows, whatever renewTime says (the
    # node's clock may be an hour off).
    assert beats.on_lease("ADDED", None, lease("a", "2020-01-01T00:00:00.000000Z")) == "a"
    advance(beats, clock, 7)
    assert beats.silence("a") == 7
    # A change that is not a renewal (its labels, say) does not count as one.
    first = lease("a", "2020-01-01T00:00:00.000000Z")
    assert beats.on_lease("MODIFIED", first, lease("a", "2020-01-01T00:00:00.000000Z", "2")) \
        is None
    assert beats.silence("a") == 7
    advance(beats, clock, 6)
    assert beats.silent(["a", "b"], 12) == {"a"}
    assert beats.on_lease("MODIFIED", first, lease("a", "2020-01-01T00:00:10.000000Z", "3")) \
        == "a"
    assert beats.silence("a") == 0 and beats.silent(["a"], 12) == set()
    beats.on_lease("DELETED", first, None)
    assert beats.silence("a") is None


def test_a_lease_is_kept_small() -> None:
    assert lease("a", "t") == {
        "metadata": {"name": "a", "namespace": "kube-node-lease", "resourceVersion": "1"},
        "spec": {"renewTime": "t"}}


def test_silence_counts_only_while_the_lease_watch_is_up() -> None:
    """An API server restarting stalls the Lease watch (its retries back off up to 30 s): no
    node is heard meanwhile, which says nothing of the nodes. Every node looked lost after
    25 s of that; now silence stops at the failure and counts again from the return."""
    clock = Clock()
    beats = Heartbeats(clock)
    advance(beats, clock, 0)
    beats.on_lease("ADDED", None, lease("a", "t0"))
    advance(beats, clock, 5)
    beats.watch_state(False)
    clock.now += 25
    assert beats.silence("a") == 5 and beats.silent(None, 12) == set()
    beats.watch_state(False)  # a second failed retry keeps the first failure's time
    clock.now += 2
    beats.watch_state(True)
    advance(beats, clock, 0)  # the other nodes, listed again
    advance(beats, clock, 8)
    assert beats.silence("a") == 8  # from the watch's return, not from before the outage
    advance(beats, clock, 4)
    assert beats.silent(["a"], 12) == {"a"}  # renewals stopped while it was watching
    beats.on_lease("MODIFIED", lease("a", "t0"), lease("a", "t1", "2"))
    assert beats.silence("a") == 0


@pytest.mark.parametrize(("seen", "now", "since"), [
    ([0, 0, 0], 11, None),  # not yet stale
    ([0, 0, 0], 12, 0),  # all three silent 12 s: the watch or the control plane, not nodes
    ([0, 0], 30, 0),  # every node silent (FullDisruption)
    ([0, 29], 30, None),  # one of two: a node loss, trusted
    ([0], 30, 0),  # the only node
    ([0, 5, 8, 20, 21], 19, None),  # the third of five is not yet 12 s silent
    ([0, 5, 8, 20, 21], 25, 8),  # three of five (55 %) silent since 8 at the latest
    ([0, 20, 20, 20, 21], 25, None),  # one node of five silent: a node loss, trusted
    ([0, 1] + [20] * 8, 25, None),  # two of ten
])
def test_a_mass_silence_is_many_nodes_silent_at_once(
    seen: list[float], now: float, since: float | None
) -> None:
    assert mass_silence_since(sorted(seen), now) == since


def test_a_watch_that_stays_open_and_delivers_nothing_makes_no_node_look_lost() -> None:
    """etcd frozen under the API server: the Lease watch stays up and delivers nothing, so
    every node falls silent at once. Silence stops growing at the mass silence and, once
    renewals flow again, counts from its end — the nodes that renew a few seconds later are
    not lost meanwhile; one that never renews again is, from then."""
    clock = Clock()
    beats = Heartbeats(clock)
    for node in "abcd":
        beats.on_lease("ADDED", None, lease(node, "t0"))
    clock.now += 30  # etcd frozen for 30 s
    assert beats.silent(None, 12) == set() and beats.silence("a") == 0
    beats.on_lease("MODIFIED", lease("a", "t0"), lease("a", "t1", "2"))
    beats.on_lease("MODIFIED", lease("b", "t0"), lease("b", "t1", "2"))  # 2 of 4 silent: over
    clock.now += 8
    assert beats.silence("c") == 8 and beats.silent(None, 12) == set()
    for node in "abc":  # a and b renew again, c for the first time since
        beats.on_lease("MODIFIED", lease(node, "t1"), lease(node, "t2", "3"))
    clock.now += 5
    assert beats.silent(None, 12) == {"d"}  # renewals flowed for 13 s, d's never came


def test_a_lease_read_from_the_api_counts_only_if_renewed_since_the_watch_showed_it() -> None:
    clock = Clock()
    beats = Heartbeats(clock)
    advance(beats, clock, 0)
    beats.on_lease("ADDED", None, lease("a", "t0"))
    advance(beats, clock, 20)
    assert not beats.confirm(lease("a", "t0"))  # the same renewal: still silent
    assert beats.silence("a") == 20
    assert beats.confirm(lease("a", "t1", "2"))  # renewed; the watch had not shown it
    assert beats.silence("a") == 0
    assert beats.confirm(lease("b", "t0"))  # a Lease the watch never showed: renewed now


READY = {"metadata": {"name": "r"}, "status": {"conditions": [{"type": "Ready",
                                                              "status": "True"}]}}
UNKNOWN = {"metadata": {"name": "u"}, "status": {"conditions": [{"type": "Ready",
                                                                "status": "Unknown"}]}}
NOT_READY = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready",
                                                                  "status": "False"}]}}


@pytest.mark.parametrize(("nodes", "full"), [
    ([], False), ([READY], False), ([UNKNOWN], True), ([UNKNOWN, READY], False),
    ([UNKNOWN, NOT_READY], True), ([UNKNOWN] * 9 + [READY], False),
])
def test_full_disruption_is_every_node_in_trouble(nodes: list[dict[str, Any]], full: bool
                                                  ) -> None:
    assert full_disruption(nodes) is full
