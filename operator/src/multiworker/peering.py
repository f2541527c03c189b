"""Whether kopf has paused this replica: kopf's own rule, applied to the peering object it keeps.

With `--peering`, every replica patches a keep-alive (priority, lifetime, last seen) into a
KopfPeering (per watched namespace) or a ClusterKopfPeering, and kopf pauses its watch streams
while another live replica has a priority at least as high. kopf does not tell handlers about
the pause, and the per-job loops are our own tasks, so they read the same object and idle by
the same rule (kopf 1.x: `kopf._core.engines.peering.process_peering_event`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_LIFETIME_SECONDS = 60  # kopf's settings.peering.lifetime


@dataclass(frozen=True)
class Peering:
    """Where this replica peers and as whom."""

    name: str
    clusterwide: bool  # one ClusterKopfPeering; else a KopfPeering per watched namespace
    namespaces: tuple[str, ...]
    identity: str
    priority: int

    @property
    def locations(self) -> tuple[str | None, ...]:
        """Where the peering objects are: a namespace each, None for the cluster-wide one."""
        return (None,) if self.clusterwide else self.namespaces


def must_pause(peerings: Iterable[Mapping[str, Any] | None], identity: str, priority: int,
           now: datetime) -> bool:
    """Paused while any peering object has another live peer with a priority at least ours.

    A missing object does not pause the loops: kopf then never starts its watch streams, so
    there are no loops to pause, and a wrong guess must not silence a working replica.
    """
    return any(_outranked(peering, identity, priority, now)
               for peering in peerings if peering is not None)


def peering_namespaces(namespaces: Iterable[str]) -> tuple[str, ...]:
    """The namespaces whose KopfPeering we can read: kopf also accepts glob patterns, whose
    peering objects live in every matching namespace — those we do not follow."""
    return tuple(ns for ns in namespaces if not any(c in ns for c in "*?[]!"))


def _outranked(peering: Mapping[str, Any], identity: str, priority: int,
               now: datetime) -> bool:
    for peer, info in (peering.get("status") or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        if _alive(info, now) and int(info.get("priority", 0)) >= priority:
            return True
    return False


def _alive(info: Mapping[str, Any], now: datetime) -> bool:
    lastseen = info.get("lastseen")
    if not lastseen:
        return True  # kopf takes a peer without a time as seen just now
    seen = datetime.fromisoformat(str(lastseen))
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=UTC)
    lifetime = timedelta(seconds=int(info.get("lifetime", DEFAULT_LIFETIME_SECONDS)))
    return seen + lifetime > now
