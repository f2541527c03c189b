"""The step of spec.elastic: a group that cannot be placed whole for shrinkAfterSeconds
is made again with the workers that fit (never fewer than minWorkers); a shrunk group whose
nodes have had room for more for growAfterSeconds is made again larger. Either way the old
pods are deleted with their grace period, so the trainers take the SIGTERM checkpoint, and the
next generation restores from it at its size (Job.at_size). The rules are decide/elastic.py;
a resize spends neither budget and is counted in status.resizes."""

from __future__ import annotations

from multiworker.api import names
from multiworker.api.conditions import Reason, Type
from multiworker.decide import history
from multiworker.decide.elastic import (
    Resize,
    Seen,
    next_look,
    next_size,
    policy_of,
    refused_since,
    room_on_nodes,
)
from multiworker.decide.fit import may_host
from multiworker.decide.workers import WorkerPhase
from multiworker.reconcile.context import Flow, Pass
from multiworker.reconcile.render import owner_reference, render_worker_pod
from multiworker.reconcile.transitions import forget_group

RECREATE = "Recreate"


def resize_policy(p: Pass) -> Flow:
    """DONE once it resized the group; else it wakes the pass when a wait ends."""
    s = p.status
    # Kueue's partial admission caps the size: more needs another admission.
    policy = policy_of(p.job.spec, s.admitted_workers or p.job.max_workers)
    if policy is None or p.group.stale or s.in_place_since is not None:
        return Flow.CONTINUE
    generation = str(s.group_generation)
    current = [pod for pod in p.pods if (pod["metadata"].get("labels") or {}).get(
        names.LABEL_GROUP_GENERATION) == generation]
    refused, refusal = refused_since(pod for pod in current
                                     if not (pod.get("spec") or {}).get("nodeName"))
    # Counted on the operator's clock from when it first saw a refusal, never the scheduler's:
    # a scheduler 120 s behind shrank the group at once, one an hour ahead waited an hour.
    s.refused_since = None if refused is None else (s.refused_since or p.now)
    room_on = _follow_room(p, refused is None and p.group.all_running and
                           len(p.group.workers) < policy.max_workers)
    seen = Seen(workers=len(p.group.workers),
                placed=sum(1 for w in p.group.workers if w.node
                           and w.phase is not WorkerPhase.MISSING),
                refused_since=s.refused_since, room=s.room_workers or 0, room_since=s.room_since,
                resized_at=s.last_resize_time, refusal=refusal,
                room_on=tuple(sorted(room_on.items())))
    decided = next_size(policy, seen, p.now)
    if decided is None:
        p.wake_at(next_look(policy, seen, p.now))
        return Flow.CONTINUE
    resize_group(p, decided, policy.max_workers)
    return Flow.DONE


def _follow_room(p: Pass, shrunk_and_running: bool) -> dict[str, int]:
    """status.roomWorkers/roomSince: how many workers the nodes hold now, and since when more
    than the group has (kept in the status: an operator restarted meanwhile waits on); the
    room node by node."""
    s = p.status
    if not shrunk_and_running:
        s.room_workers, s.room_since = None, None
        return {}
    pod_spec = render_worker_pod(p.job, 0, s.group_generation, owner_reference(p.job),
                                 gpu_product=s.gpu_product)["spec"]
    nodes = [n for n in p.cluster.cached_nodes() if may_host(n, pod_spec)]
    # The operator's cache holds its jobs' pods only: what others hold is asked of the API.
    on_nodes = [p.cluster.pods_on_node(str(n["metadata"]["name"])) for n in nodes]
    if any(pods is None for pods in on_nodes):
        s.room_workers, s.room_since = None, None  # unknown: never grow blind
        return {}
    found = room_on_nodes(nodes, [pod for pods in on_nodes for pod in pods or []], pod_spec,
                          p.job.uid)
    room = s.room_workers = sum(found.values())
    if room <= len(p.group.workers):
        s.room_since = None
    elif s.room_since is None:
        s.room_since = p.now
    return found


def resize_group(p: Pass, resize: Resize, max_workers: int) -> None:
    """The next generation, at the new size: recreated (a different TF_CONFIG), counting
    nothing but the resize."""
    s = p.status
    grows = resize.grows(len(p.group.workers))
    reason = Reason.GREW if grows else Reason.SHRUNK
    s.history = history.ended(s.history, s.group_generation, reason, resize.why, p.now)
    s.group_generation += 1
    s.history = history.began(s.history, s.group_generation, resize.workers, "Recreate", p.now)
    s.group_start_time, s.restart_after, s.placing_since = None, None, None
    s.group_workers = None if resize.workers == max_workers else resize.workers
    s.resizes = (s.resizes or 0) + 1
    s.last_resize_time, s.room_since, s.room_workers = p.now, None, None
    s.restart_path = RECREATE
    forget_group(s)
    p.condition(Type.RESTARTING, "True", reason, resize.why)
    p.emit(reason, resize.why)
    p.log.warning("%s", resize.why)
    p.wake_in(0)
