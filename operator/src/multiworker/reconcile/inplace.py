"""The steps of an in-place restart (decide/inplace.py decides when one may run): the last
generation's pods moved to the new one, their agents told at once (signed notes); the barrier
that releases the generation in every pod together once each old trainer has stopped and its
gate holds, or abandons the restart for a recreation when that cannot happen; and each
trainer's exit written on its pod before the kubelet's restart of its containers hides it.
"""

from __future__ import annotations

from collections.abc import Sequence

from multiworker.api import names
from multiworker.clients.agents import AgentNote
from multiworker.clients.writes import PodPatch
from multiworker.decide.inplace import RETELL_EVERY, STOP_BOUND, retell_at, stop_deadline
from multiworker.decide.observe import StalePod
from multiworker.decide.workers import WAITING_FOR_RELEASE, WorkerPhase, WorkerState, exit_record
from multiworker.reconcile.context import Flow, Pass
from multiworker.reconcile.transitions import (
    abandon_in_place,
)


def release_in_place(p: Pass) -> Flow:
    """An in-place restart's barrier: once every worker's old trainer has stopped and its
    gate holds the pod (and the backoff has passed), release the generation in every pod at
    once. A pod gone, disrupted or on a node in trouble meanwhile, or old trainers still
    running after inplace.STOP_BOUND, and the group is recreated instead."""
    s = p.status
    if s.in_place_since is None or p.group.stale:
        return Flow.CONTINUE
    workers, generation = p.group.workers, s.group_generation
    if all(w.released == generation and w.phase is not WorkerPhase.MISSING for w in workers):
        # Released by a pass whose status write did not land (a conflict, a timeout, the
        # leader gone): the group trains already. Finish that release, never abandon it.
        _released(p, workers, generation)
        return Flow.CONTINUE
    why = next((f"worker-{w.index}'s pod is gone" if w.phase is WorkerPhase.MISSING
                else f"worker-{w.index}'s pod was disrupted ({w.reason})"
                for w in workers
                if w.phase in (WorkerPhase.MISSING, WorkerPhase.DISRUPTED) or w.terminating),
               None)
    why = why or next((f"worker-{w.index}'s {p.troubles[w.node].describe()}"
                       for w in workers if w.node in p.troubles), None)
    held = [w for w in workers if w.reason == WAITING_FOR_RELEASE]
    deadline = stop_deadline(s.in_place_since)
    if why is None and len(held) < len(workers) and p.now >= deadline:
        late = next(w for w in workers if w.reason != WAITING_FOR_RELEASE)
        why = (f"worker-{late.index} had not stopped {STOP_BOUND.total_seconds():g}s after "
               f"the restart began ({late.reason}: {late.message})")
    if why is not None:
        abandon_in_place(p, why)
        return Flow.DONE
    if len(held) < len(workers):
        _retell(p, [w for w in workers if w.reason != WAITING_FOR_RELEASE], generation)
        p.wake_at(min(deadline, retell_at(s.in_place_since, p.now)))
        return Flow.CONTINUE
    if s.restart_after is not None and p.now < s.restart_after:
        p.wake_at(s.restart_after)
        return Flow.CONTINUE
    # Restarted now, as far as the start-up timeout goes: the barrier and the backoff before
    # the release are the operator's own wait, not the trainers' start.
    patches = [PodPatch(p.job.namespace, w.pod, w.uid, annotations={
        names.ANNOTATION_RELEASED: str(generation),
        names.ANNOTATION_RESTARTED_AT: p.now.isoformat(),
        names.ANNOTATION_TRAINER_RESTARTS: str(w.trainer_restarts)}) for w in workers]
    if not all(p.cluster.patch_pods(patches)):
        abandon_in_place(p, "a worker's pod was replaced while its generation was released")
        return Flow.DONE
    _released(p, workers, generation)
    return Flow.CONTINUE


def _retell(p: Pass, late: Sequence[WorkerState], generation: int) -> None:
    """Tell the pods not holding yet of the rise again once RETELL_EVERY has passed since
    it began: a note lost to a busy agent would otherwise leave them to the downwardAPI."""
    assert p.status.in_place_since is not None
    if p.now - p.status.in_place_since < RETELL_EVERY:
        return
    port = p.job.spec.restart_policy.agent_port
    p.agent_notes += [AgentNote(w.ip, port, w.uid, generation) for w in late if w.ip]


def _released(p: Pass, workers: Sequence[WorkerState], generation: int) -> None:
    """The release is on every pod: tell the agents (again, when an earlier pass released)
    and end the barrier."""
    s = p.status
    assert s.in_place_since is not None
    port = p.job.spec.restart_policy.agent_port
    p.agent_notes += [AgentNote(w.ip, port, w.uid, generation, released=generation)
                      for w in workers if w.ip]
    stopped = (p.now - s.in_place_since).total_seconds()
    s.in_place_since = None
    p.log.info("generation %s released in place: every old trainer stopped within %.1fs",
               generation, stopped)


def remember_exits(p: Pass) -> Flow:
    """Write the exit of a trainer restarted by its pod's rule on the pod, as first seen: the
    kubelet's restart of the pod's containers soon leaves only its own record ("restarted,
    137"), and the exit code decides what happens (FailJob rules, a peer's symptom)."""
    s = p.status
    patches = [PodPatch(p.job.namespace, w.pod, w.uid, annotations={
        names.ANNOTATION_TRAINER_EXIT: exit_record(s.group_generation, w)})
        for w in p.group.workers
        if w.agent and w.phase is WorkerPhase.FAILED and w.exit_code is not None
        and not w.exit_recorded and w.uid and not w.terminating]
    if patches:
        p.cluster.patch_pods(patches)
    return Flow.CONTINUE


def move_in_place(p: Pass) -> list[StalePod]:
    """While the group restarts in place: move the last generation's pods to the current one
    (their agents then restart their containers, pod/agent.py); the stale pods left to
    delete. A pod that cannot be moved (gone) is found missing by release_in_place."""
    s = p.status
    if s.in_place_since is None:
        return list(p.group.stale)
    moving = [pod for pod in p.group.stale
              if pod.generation == s.group_generation - 1 and pod.deletion is None]
    if moving:
        at = p.now.isoformat()
        p.cluster.patch_pods([PodPatch(p.job.namespace, pod.name, pod.uid, labels={
            names.LABEL_GROUP_GENERATION: str(s.group_generation)}, annotations={
            names.ANNOTATION_RESTARTED_AT: at}) for pod in moving])
        port = p.job.spec.restart_policy.agent_port
        p.agent_notes += [AgentNote(pod.ip, port, pod.uid, s.group_generation)
                          for pod in moving if pod.ip]
        p.log.info("restarting %d pods in place for generation %s", len(moving),
                   s.group_generation)
    return [pod for pod in p.group.stale if pod not in moving]
