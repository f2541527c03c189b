"""The trouble of the nodes a job's workers run on, as a pass sees it: each node's status and
taints from the cache (read again from the API before acting on them), its Lease gone silent,
and when each node was last seen renewing its Lease (the operator's clock). What a trouble
means for the workers is decide/lost_nodes.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from multiworker.decide.nodes import (
    HEARTBEAT_STALE,
    NodeTrouble,
    combined,
    full_disruption,
    heartbeat_trouble,
    node_trouble,
)
from multiworker.decide.workers import WorkerPhase
from multiworker.reconcile.context import ClusterIO, Pass

Manifest = dict[str, Any]


def reread_troubles(p: Pass, node_names: set[str]) -> Mapping[str, NodeTrouble]:
    """Reads `node_names` from the API (not the cache) into p.troubles, before acting on them:
    the Node, and the Lease of one that looks silent."""
    troubles = dict(p.troubles)
    manifests = {}
    for node in node_names - {""}:
        if (old := troubles.get(node)) is not None and old.reason == HEARTBEAT_STALE:
            p.cluster.reread_lease(node)
        manifests[node] = p.cluster.get_node(node)
    fresh = node_troubles(p.cluster, set(manifests), p.now, manifests)
    for node in manifests:
        if node in fresh:
            troubles[node] = fresh[node]
        else:
            troubles.pop(node, None)
    p.troubles = troubles
    return troubles


def renewals_of(p: Pass) -> dict[str, datetime]:
    """When the nodes of the running workers were last seen renewing their Leases (the
    operator's clock: now less the silence since the renewal arrived)."""
    found: dict[str, datetime] = {}
    for worker in p.group.with_phase(WorkerPhase.RUNNING, WorkerPhase.STARTING):
        if worker.node and worker.node not in found:
            silence = p.cluster.heartbeat_silence(worker.node)
            if silence is not None:
                found[worker.node] = p.now - timedelta(seconds=silence)
    return found


def node_troubles(cluster: ClusterIO, node_names: set[str], now: datetime,
                  manifests: Mapping[str, Manifest | None] | None = None
                  ) -> dict[str, NodeTrouble]:
    """The nodes' trouble: their status and taints (as cached, or as `manifests` were read
    just now), or a Lease gone silent. While the Node objects call every node in trouble
    (nodes.full_disruption) they say nothing of the nodes: only a deleted one counts."""
    reported = {node: node_trouble(node, manifests[node] if manifests and node in manifests
                                   else cluster.cached_node(node))
                for node in node_names - {""}}
    if any(t is not None and t.reason != "Gone" for t in reported.values()) and \
            full_disruption(cluster.cached_nodes()):
        reported = {n: t if t is not None and t.reason == "Gone" else None
                    for n, t in reported.items()}
    found = {}
    for node, trouble in reported.items():
        either = combined(trouble, heartbeat_trouble(node, cluster.heartbeat_silence(node), now))
        if either is not None:
            found[node] = either
    return found
