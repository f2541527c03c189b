"""kopf's pause rule, applied to the peering object: idle while another live peer outranks us."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.peering import Peering, must_pause, peering_namespaces

from tests.unit.builders import at, stamp

ME = "operator-7d9f-abcde"


def peering(**peers: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "mwo"}, "status": peers}


def peer(priority: int, seen: float = 0, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": stamp(seen)}


@pytest.mark.parametrize(("others", "paused"), [
    ({}, False),
    ({"b": peer(10)}, False),  # we outrank it
    ({"b": peer(500)}, True),
    ({"b": peer(100)}, True),  # a tie pauses both, as in kopf
    ({"b": peer(500, seen=-61)}, False),  # dead: its keep-alive expired
    ({"b": {"priority": 500}}, True),  # no time: kopf takes it as alive
    ({"b": None}, False),  # a peer removing itself
], ids=["alone", "lower", "higher", "tie", "dead", "no lastseen", "removed"])
def test_pause_rule(others: dict[str, Any], paused: bool) -> None:
    body = peering(**{ME: peer(100)}, **others)
    assert must_pause([body], ME, 100, at(0)) is paused


def test_any_peering_object_pauses_and_missing_ones_do_not() -> None:
    calm, busy = peering(b=peer(1)), peering(b=peer(1000))
    assert must_pause([calm, busy], ME, 100, at(0))
    assert not must_pause([calm, None], ME, 100, at(0))


def test_locations() -> None:
    assert Peering("mwo", True, (), ME, 1).locations == (None,)
    assert Peering("mwo", False, ("a", "b"), ME, 1).locations == ("a", "b")
    assert peering_namespaces(["a", "team-*", "b"]) == ("a", "b")
