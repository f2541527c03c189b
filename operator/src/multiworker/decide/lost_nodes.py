"""Pure: which workers are lost with their nodes, and when. A node in trouble — unreachable,
NotReady, deleted, or silent (its Lease not renewed) — takes its started workers with it once
the trouble has lasted spec.health.nodeLostSeconds, unless the worker was bound after the
trouble began (the scheduler saw the node back) or, for a silent Lease, it still answers the
operator's polls (the node is up; its kubelet alone is not). What to do then is policy.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.decide.nodes import HEARTBEAT_STALE, NodeTrouble
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.progress import GroupHealth
from multiworker.decide.workers import WorkerPhase, WorkerState


def lost_before(group: ObservedGroup, troubles: Mapping[str, NodeTrouble],
                health: GroupHealth | None, moment: datetime
                ) -> tuple[WorkerState, NodeTrouble] | None:
    """A worker whose node's trouble had begun by `moment` (a deleted node: any time)."""
    for worker, trouble in workers_in_trouble(group, troubles, health):
        if trouble.reason == "Gone" or (trouble.since is not None and trouble.since <= moment):
            return worker, trouble
    return None


def unproven_nodes(group: ObservedGroup, renewals: Mapping[str, datetime],
                   moment: datetime) -> bool:
    """Whether a running worker's node has not been seen renewing its Lease since `moment`
    (nodes whose Leases are not watched prove nothing either way)."""
    return any(w.node in renewals and renewals[w.node] < moment
               for w in group.with_phase(WorkerPhase.RUNNING, WorkerPhase.STARTING))


def workers_in_trouble(group: ObservedGroup, troubles: Mapping[str, NodeTrouble],
                       health: GroupHealth | None = None
                       ) -> list[tuple[WorkerState, NodeTrouble]]:
    """Started workers with the trouble of their node — unless the pod was bound after that
    trouble (NotReady, unreachable) began (the scheduler saw the node back by then, and the
    operator's copy of the node is older than the pod's: a returning node, the pod and node
    watches out of step), or the trouble is a silent Lease and the worker answered a poll made
    since (the node is up; its kubelet alone is not) — then only what the node object reports
    counts: a node the control plane calls NotReady is lost however well its pods train, since
    nothing can stop or evict them there."""
    found = []
    for worker in group.with_phase(WorkerPhase.RUNNING, WorkerPhase.STARTING):
        trouble = troubles.get(worker.node) if worker.node else None
        if trouble is not None and trouble.reason == HEARTBEAT_STALE and \
                answered_since(health, group.generation, worker.index, trouble.since):
            trouble = trouble.reported
        if trouble is None:
            continue
        # Not for a silent Lease: the node still looks Ready to the scheduler then.
        if trouble.reason != HEARTBEAT_STALE and trouble.since is not None and \
                worker.scheduled_at is not None and worker.scheduled_at > trouble.since:
            continue
        found.append((worker, trouble))
    return found


def answered_since(health: GroupHealth | None, generation: int, index: int,
                   since: datetime | None) -> bool:
    """Whether worker `index` still answers polls made after `since`: it answered the latest,
    or missed that one alone and was answering when `since` came. One slow answer from a busy
    node is not a lost node (the veto lapses one poll later); two misses in a row are."""
    if health is None or health.generation != generation or since is None:
        return False
    track = health.worker(index)
    if track is None or health.polled_at <= since:
        return False
    return track.answering or (track.missed_polls == 1 and track.silent_since is not None
                               and track.silent_since > since)


def lost_after(trouble: NodeTrouble, now: datetime, grace: timedelta) -> bool:
    """A deleted node is lost at once; any other trouble after `grace`, and trouble of unknown
    age never (a later node update with a time wakes the job)."""
    if trouble.reason == "Gone":
        return True
    return trouble.since is not None and now - trouble.since >= grace


def node_lost(spec: MultiWorkerJobSpec, trouble: NodeTrouble, now: datetime) -> bool:
    """Whether `trouble` has lasted spec.health.nodeLostSeconds (a deleted node at once)."""
    return lost_after(trouble, now, timedelta(seconds=spec.health.node_lost_seconds))


def node_lost_at(spec: MultiWorkerJobSpec, trouble: NodeTrouble) -> datetime | None:
    """When `trouble` will have lasted spec.health.nodeLostSeconds (None: unknown age)."""
    if trouble.since is None:
        return None
    return trouble.since + timedelta(seconds=spec.health.node_lost_seconds)


def lost_nodes(spec: MultiWorkerJobSpec, group: ObservedGroup,
               troubles: Mapping[str, NodeTrouble], now: datetime,
               health: GroupHealth | None = None) -> set[str]:
    """The nodes that make a worker lost now (the operator reads them again before acting)."""
    return {w.node for w, t in workers_in_trouble(group, troubles, health)
            if node_lost(spec, t, now)}


def lost_node_deadline(spec: MultiWorkerJobSpec, group: ObservedGroup,
                       troubles: Mapping[str, NodeTrouble],
                       health: GroupHealth | None = None) -> datetime | None:
    """When the earliest worker on a troubled node counts as lost (to look again then). A
    silent Lease explained away by an answering worker sets none: a poll that finds the
    worker silent wakes the job (poller news), and so does the node object's next update."""
    times = [at for _, t in workers_in_trouble(group, troubles, health)
             if (at := node_lost_at(spec, t)) is not None]
    return min(times) if times else None
