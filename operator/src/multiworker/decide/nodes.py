"""Pure: whether a node can still run (and stop) its pods — for lost-node restarts and for
when force-deleting a stale pod is safe.

Kubernetes itself evicts pods from an unreachable node only after about five minutes
(tolerationSeconds of the not-ready/unreachable taints); a training group is dead as soon as
one worker's node is gone, so the operator acts after spec.health.nodeLostSeconds instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

Node = Mapping[str, Any]

# The kubelet renews its node's Lease in kube-node-lease every 10 s (a quarter of its default
# nodeLeaseDurationSeconds, 40); the node controller calls the node NotReady only after 50 s
# without one. A Lease the operator has not seen renewed for one interval and a margin is
# trouble, dated from the last renewal it saw arrive (its own clock: never the kubelet's).
KUBELET_RENEW_SECONDS = 10.0
STALE_HEARTBEAT_SECONDS = KUBELET_RENEW_SECONDS + 2.0
HEARTBEAT_STALE = "HeartbeatStale"
# When every node, or more than two and at least this share of them, go silent at once,
# suspect the watch or the control plane (a frozen etcd, an API server that hangs), not the
# nodes: the node lifecycle controller's own lines for a zone in FullDisruption and
# PartialDisruption (kube-controller-manager --unhealthy-zone-threshold 0.55, more than 2).
MASS_SILENCE_SHARE = 0.55
MASS_SILENCE_MIN_NODES = 3

_TAINTS = {"node.kubernetes.io/unreachable": "Unreachable",
           "node.kubernetes.io/not-ready": "NotReady"}


@dataclass(frozen=True)
class NodeTrouble:
    """Why a node cannot be trusted to run or stop pods, and since when (None: unknown, or
    Gone, which counts at once)."""

    node: str
    reason: str  # Gone, Unreachable, NotReady, HeartbeatStale
    since: datetime | None
    message: str
    # On a silent Lease: what the node object itself reports, which stands when the Lease's
    # silence is explained away (its workers still answer: only the kubelet is cut off).
    reported: NodeTrouble | None = None

    def describe(self) -> str:
        at = " at" if self.reason == HEARTBEAT_STALE else " since"
        when = f"{at} {self.since.strftime('%H:%M:%S')}" if self.since else ""
        detail = f" ({self.message})" if self.message else ""
        what = {"Gone": "was deleted", "Unreachable": "is unreachable",
                "NotReady": "is NotReady",
                HEARTBEAT_STALE: "last renewed its Lease"}.get(self.reason, self.reason)
        return f"node {self.node} {what}{when}{detail}"


def heartbeat_trouble(name: str, silence: float | None, now: datetime) -> NodeTrouble | None:
    """Trouble when node `name`'s Lease has not been seen renewed for `silence` seconds, more
    than one renewal interval and a margin (None: renewed in time, or no Lease seen)."""
    if silence is None or silence < STALE_HEARTBEAT_SECONDS:
        return None
    return NodeTrouble(name, HEARTBEAT_STALE, now - timedelta(seconds=silence),
                       f"no renewal seen for {silence:.0f}s; its kubelet renews every "
                       f"{KUBELET_RENEW_SECONDS:.0f}s")


def combined(reported: NodeTrouble | None, silent: NodeTrouble | None) -> NodeTrouble | None:
    """The trouble that began first: what the node object reports (a deleted node first of
    all; unknown age last) or its Lease gone silent — the latter keeping the former."""
    if silent is None:
        return reported
    if reported is None:
        return silent
    if reported.reason == "Gone" or (reported.since is not None and silent.since is not None
                                     and reported.since <= silent.since):
        return reported
    return replace(silent, reported=reported)


def node_trouble(name: str, node: Node | None) -> NodeTrouble | None:
    """The trouble of node `name` as last seen (None: it is Ready).

    Since when is read from the Ready condition's lastTransitionTime, else from a NoExecute
    taint's timeAdded (not on a node Ready again, whose taints are leftovers). The NoSchedule
    not-ready/unreachable taints carry no time: one alone (a kubelet restart, a one-second
    runtime hiccup) is trouble of unknown age, which never counts as long ago."""
    if node is None:
        return NodeTrouble(name, "Gone", None, "the node object no longer exists")
    reason, since, message, ready = None, None, "", False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            ready = True
        elif condition.get("type") == "Ready":
            reason = "Unreachable" if condition.get("status") == "Unknown" else "NotReady"
            since = _time(condition.get("lastTransitionTime"))
            message = condition.get("message") or ""
    for taint in (node.get("spec") or {}).get("taints") or []:
        tainted = _TAINTS.get(taint.get("key", ""))
        if tainted is not None and taint.get("effect") in ("NoExecute", "NoSchedule"):
            reason = reason or tainted
            # Ready again: the node lifecycle controller removes its taints seconds later, and
            # until then their timeAdded dates the outage that just ended, not a current one.
            since = since or (None if ready else _time(taint.get("timeAdded")))
    return NodeTrouble(name, reason, since, message) if reason is not None else None


def full_disruption(nodes: Iterable[Node]) -> bool:
    """Every node NotReady or unreachable (one at least): the node lifecycle controller's
    FullDisruption, where it stops evicting and suspects the control plane — an API server
    back from an outage finds every Lease stale and marks every node unreachable until its
    kubelet posts again. What the Node objects report then says nothing of the nodes (and a
    group could go nowhere else anyway)."""
    seen = False
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        if node_trouble(name, node) is None:
            return False
        seen = True
    return seen


def mass_silence_since(ordered_seen: Sequence[float], now: float,
                       stale: float = STALE_HEARTBEAT_SECONDS) -> float | None:
    """Since when nothing is heard from many nodes at once (MASS_SILENCE_SHARE of them `stale`
    seconds silent), by the operator's clock: the last renewal heard from any of them — the
    silence after it says nothing of the nodes. None while too few are silent.
    `ordered_seen`: when each node's Lease was last seen renewed, oldest first."""
    count = len(ordered_seen)
    need = min(count, max(MASS_SILENCE_MIN_NODES, math.ceil(MASS_SILENCE_SHARE * count)))
    if need == 0:
        return None
    last_heard = ordered_seen[need - 1]
    return last_heard if last_heard + stale <= now else None


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
