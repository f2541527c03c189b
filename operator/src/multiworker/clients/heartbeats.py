"""Node heartbeats as the operator sees them arrive: the kubelet renews its node's Lease in
kube-node-lease every 10 s, long before a dead node turns NotReady (50 s), so a Lease that
stops being renewed is the earliest sign of a lost node.

Renewals are timed by this process's monotonic clock when their watch event arrives, never by
the renewTime the kubelet wrote: the two clocks need not agree, and a skewed node must not
look dead (or alive). Cheap at 1,000 nodes: one watch, ~100 small events a second, each kept
as a float per node.

Silence means renewals stopped while the watch was up: a watch that fails (an API server
restarting; its retries back off up to 30 s) hears nothing of any node, which says nothing of
the nodes. So silence stops growing when the watch fails, and counts again only from when it
is back (watch_state, from the Lease informer). A watch can also stay open and deliver nothing
(etcd frozen): when many nodes go silent at once (nodes.mass_silence_since) the same holds
until renewals end it. A real loss of most nodes then shows through the Node objects (NotReady,
~50 s) instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS, mass_silence_since

Manifest = dict[str, Any]

NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASES_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"


def slim_lease(lease: Manifest) -> Manifest:
    """A node Lease as heartbeat tracking reads it: its name (the node's) and renewTime."""
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")
                         if k in meta},
            "spec": {"renewTime": spec.get("renewTime")}}


class Heartbeats:
    """When each node's Lease was last seen renewed, by the operator's own clock. Fed by the
    Lease informer's events; read by reconcile passes (threads) as seconds of silence."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 stale: float = STALE_HEARTBEAT_SECONDS) -> None:
        self._clock = clock
        self._stale = stale
        self._seen: dict[str, float] = {}
        self._renew_times: dict[str, Any] = {}  # the renewTime last seen, by node
        self._ordered: list[float] | None = None  # _seen's times, oldest first (lazily)
        self._lock = threading.Lock()
        self._down_since: float | None = None  # the watch failed then, and is not back yet
        self._back_at = float("-inf")  # the watch (or a mass silence) last ended then

    def watch_state(self, up: bool) -> None:
        """The Lease watch failed (False) or is delivering again (True)."""
        with self._lock:
            if not up:
                self._down_since = self._down_since or self._clock()
            elif self._down_since is not None:
                self._down_since, self._back_at = None, self._clock()

    def _suspect_since(self, now: float) -> float | None:
        """Since when the watch is not to be trusted: failed, or many nodes silent at once
        (lock held)."""
        if self._ordered is None:
            self._ordered = sorted(self._seen.values())
        mass = mass_silence_since(self._ordered, now, self._stale)
        if mass is None or self._down_since is None:
            return self._down_since if mass is None else mass
        return min(mass, self._down_since)

    def _silence(self, seen: float, now: float, suspect: float | None) -> float:
        """Seconds of trusted silence since `seen` (lock held)."""
        until = now if suspect is None else suspect
        return max(0.0, until - max(seen, self._back_at))

    def on_lease(self, kind: str, old: Manifest | None, new: Manifest | None) -> str | None:
        """Records a renewal (a Lease listed or added counts as renewed now); the node's name
        when this was one, else None."""
        lease = new or old or {}
        node = str((lease.get("metadata") or {}).get("name", ""))
        now = self._clock()
        with self._lock:
            if new is not None and old is not None and _renewed(old) == _renewed(new):
                return None
            suspected = self._suspect_since(now) is not None
            if new is None:
                self._seen.pop(node, None)
                self._renew_times.pop(node, None)
            else:
                self._seen[node] = now
                self._renew_times[node] = _renewed(new)
            self._ordered = None
            if suspected and self._suspect_since(now) is None:
                self._back_at = now  # a mass silence ended: the rest count from here
        return node if new is not None else None

    def confirm(self, lease: Manifest) -> bool:
        """A Lease read from the API rather than the watch (before acting on its silence):
        whether it was renewed since the watch last showed it — then it counts, as if the
        watch had delivered it."""
        node = str((lease.get("metadata") or {}).get("name", ""))
        with self._lock:
            known = node in self._seen and self._renew_times.get(node) == _renewed(lease)
        return not known and self.on_lease("MODIFIED", None, lease) is not None

    def silence(self, node: str) -> float | None:
        """Seconds since `node`'s Lease was last seen renewed; None: no Lease seen."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(node)
            return None if seen is None else self._silence(seen, now, self._suspect_since(now))

    def silent(self, nodes: Iterable[str] | None, seconds: float) -> set[str]:
        """Those of `nodes` (None: every node with a Lease) whose Lease has not been seen
        renewed for `seconds` or more."""
        now = self._clock()
        with self._lock:
            suspect = self._suspect_since(now)
            names = self._seen if nodes is None else nodes
            return {n for n in names if (seen := self._seen.get(n)) is not None
                    and self._silence(seen, now, suspect) >= seconds}


def _renewed(lease: Manifest) -> Any:
    return (lease.get("spec") or {}).get("renewTime")
