"""Pure policies — when do we restart the group, fail or finish the job — in one place.

No I/O: each function takes the spec, the last status and what was observed, and returns an
Action. Whom a failure is blamed on is culprits.py's; a symptom (a worker that exited because
a peer went away) waits a short window here, in which the peer's own failure may still show
up. Which workers a node takes with it is lost_nodes.py's, a group's start-up startup.py's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from multiworker.api.conditions import Reason
from multiworker.api.spec import ExitCodeAction, ImageSkewPolicy, MultiWorkerJobSpec, SuccessPolicy
from multiworker.api.status import FailureRecord, JobStatus
from multiworker.decide.culprits import (
    Culprit,
    failed_workers,
    first_failure,
    is_symptom,
    lost_node_culprit,
    stall_culprit,
    worker_culprit,
)
from multiworker.decide.gpus import GPU_RESOURCE
from multiworker.decide.hang import Stall
from multiworker.decide.lost_nodes import (
    lost_after,
    lost_before,
    unproven_nodes,
    workers_in_trouble,
)
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS, NodeTrouble
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.progress import GroupHealth
from multiworker.decide.startup import starting_workers, startup_error
from multiworker.decide.workers import EVICTED_FOR_USAGE, WorkerPhase, WorkerState

# How long a symptom waits for the failure that caused it to show in the API: the kubelets
# of two nodes report a pod's end a second or more apart.
COLLATERAL_WINDOW = timedelta(seconds=5)
# How long a symptom waits for a peer's node to prove itself up by renewing its Lease: once it
# is this long silent it is trouble (nodes.heartbeat_trouble), and the symptom a disruption.
NODE_PROOF_WINDOW = timedelta(seconds=STALE_HEARTBEAT_SECONDS + 1)
# How long the pods left of a group that ended broken get to stop (their own grace period if
# shorter): a grace period is for the coordinated checkpoint on SIGTERM, which no worker of a
# broken collective can take — its trainer would sit in a collective until SIGKILL. Seconds
# are left for sidecars to flush.
BROKEN_GROUP_GRACE_SECONDS = 3
# A broken group's survivors writing their copy of the state (runtime/survivors.py) get twice
# the time the chief expects writing it once to take (status.progress.expectedSaveSeconds: on
# a shared volume the survivors' parts share its bandwidth), after the time a survivor waiting
# in the broken collective takes to tell it is stuck (no step for three of its usual ones),
# and this margin; this long when the chief reported no figure (it had not stepped yet) or a
# shorter one.
SURVIVOR_SAVE_MARGIN_SECONDS = 5
SURVIVOR_SAVE_FLOOR_SECONDS = 10
SURVIVOR_STUCK_STEPS = 3  # runtime/survivors.Witness.stuck
# How often a group the scheduler refuses looks again at the nodes it was created to avoid: a
# renewed Lease wakes no job that has no pod on that node.
AVOIDED_NODE_RECHECK_SECONDS = 5.0
# Waiting reasons that no amount of waiting fixes.
FAIL_AT_ONCE_WAITING_REASONS = frozenset({"InvalidImageName"})
_MAX_DOUBLINGS = 32


class ActionKind(StrEnum):
    NONE = "None"
    WAIT = "Wait"  # look again in `delay_seconds` before deciding
    RESTART_GROUP = "RestartGroup"  # spends a restart of spec.restartPolicy.maxRestarts
    RESTART_GROUP_UNCOUNTED = "RestartGroupWithoutCounting"  # a disruption
    REPLACE_GROUP = "ReplaceGroup"  # a group that never ran, made again: spends nothing
    FAIL_JOB = "FailJob"
    SUCCEED = "Succeed"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str = ""
    message: str = ""
    culprit: Culprit | None = None
    delay_seconds: float = 0
    pin_image: str | None = None  # restart with every worker on this image (image skew)


NO_ACTION = Action(ActionKind.NONE)




# --- the decisions ---


def backoff_seconds(base: int, cap: int, spent: int) -> int:
    """Delay before attempt number `spent + 1`: `base` doubling, capped."""
    return min(cap, int(base * 2 ** min(spent, _MAX_DOUBLINGS)))


def failure_action(
    spec: MultiWorkerJobSpec, status: JobStatus, group: ObservedGroup, *,
    group_started: bool, now: datetime, troubles: Mapping[str, NodeTrouble] | None = None,
    health: GroupHealth | None = None, renewals: Mapping[str, datetime] | None = None,
) -> Action:
    """Restart the group, fail the job, wait, or nothing — for failed workers, workers on
    lost nodes and stuck starts. `renewals`: when each node's Lease was last seen renewed.

    A symptom alone (a worker whose collective aborted because a peer vanished) is the job's
    failure only once its peers' nodes are known to be up: a node that powers off resets its
    workers' connections at once, long before its Lease is missed. So a peer's node already in
    trouble makes it a disruption, and a node not seen renewing since the symptom is given one
    renewal interval to do so (NODE_PROOF_WINDOW)."""
    failures = failed_workers(group, group_started)
    if failures:
        worker = first_failure(failures)
        # On the operator's clock, like the Lease arrivals and `now` (never a node's).
        seen = worker.seen_at or worker.since
        if is_symptom(worker) and seen is not None:
            lost = lost_before(group, troubles or {}, health, seen)
            if lost is not None:
                return disruption_action(spec, status, lost_node_culprit(*lost))
            wait_until = seen + COLLATERAL_WINDOW
            if unproven_nodes(group, renewals or {}, seen):
                wait_until = max(wait_until, seen + NODE_PROOF_WINDOW)
            if now < wait_until:
                return Action(ActionKind.WAIT, delay_seconds=(wait_until - now).total_seconds())
        return _on_failure(spec, status, worker, health, group.generation)
    action = image_skew_action(spec, status, group)
    if action.kind is ActionKind.NONE:
        action = lost_node_action(spec, status, group, now, troubles or {}, health)
    if action.kind is ActionKind.NONE:
        action = startup_action(spec, group, now, status.placing_since)
    return action


def image_skew_action(spec: MultiWorkerJobSpec, status: JobStatus,
                      group: ObservedGroup) -> Action:
    """Workers of one group that run different image digests (a tag resolved differently on
    different nodes) must not train together: pin the next group to the chief's digest, or
    fail, as spec.imageSkewPolicy says."""
    images = {w.index: w.image_id for w in group.workers
              if w.phase in (WorkerPhase.RUNNING, WorkerPhase.SUCCEEDED) and w.image_id}
    if len(set(images.values())) < 2:
        return NO_ACTION
    chief = images.get(0) or images[min(images)]
    odd = min(i for i, image in images.items() if image != chief)
    listing = ", ".join(f"worker-{i} {image}" for i, image in sorted(images.items()))
    culprit = Culprit(odd, Reason.IMAGE_SKEW, f"workers run different images ({listing})",
                      message=listing)
    if spec.image_skew_policy is ImageSkewPolicy.FAIL_JOB:
        return Action(ActionKind.FAIL_JOB, Reason.IMAGE_SKEW,
                      f"{culprit.description}; spec.imageSkewPolicy is FailJob", culprit)
    if status.pinned_image is not None or "@" not in chief:
        why = ("they still differ after pinning" if status.pinned_image else
               f"the chief's image {chief} has no registry digest to pin to")
        return Action(ActionKind.FAIL_JOB, Reason.IMAGE_SKEW, f"{culprit.description}; {why}",
                      culprit)
    return Action(ActionKind.RESTART_GROUP_UNCOUNTED, Reason.IMAGE_SKEW,
                  f"restarting group: {culprit.description}; every worker now runs the "
                  f"chief's {chief} (spec.imageSkewPolicy PinToChief; not counted as a restart)",
                  culprit, pin_image=chief)


def _on_failure(spec: MultiWorkerJobSpec, status: JobStatus, worker: WorkerState,
                health: GroupHealth | None, generation: int) -> Action:
    culprit = worker_culprit(worker)
    if worker.phase is WorkerPhase.DISRUPTED:
        return disruption_action(spec, status, culprit)
    code = worker.exit_code
    if code is not None and spec.restart_policy.action_for(code) is ExitCodeAction.FAIL_JOB:
        return Action(ActionKind.FAIL_JOB, Reason.EXIT_CODE_FAILS_JOB,
                      f"{culprit.description}; exit code {code} fails the job "
                      "(spec.restartPolicy)", culprit)
    error = startup_error(worker, health, generation)
    if error is not None:
        culprit = replace(culprit, startup_error=error.shape(code))
        hint = f"; hint: {error.hint()}" if error.hint() else ""
        last = status.last_failure
        if spec.restart_policy.fail_fast_on_repeated_startup_error and last is not None \
                and last.startup_error == culprit.startup_error:
            return Action(
                ActionKind.FAIL_JOB, Reason.REPEATED_STARTUP_ERROR,
                f"{culprit.description}; generation {last.generation} died of the same error "
                "before training a step, as every restart would "
                f"(spec.restartPolicy.failFastOnRepeatedStartupError){hint}", culprit)
        culprit = replace(culprit, description=culprit.description + hint)
    reason = Reason.EVICTED_FOR_USAGE if worker.reason == EVICTED_FOR_USAGE else \
        Reason.WORKER_FAILED
    return counted_restart(spec, status, culprit, reason)


def lost_node_action(spec: MultiWorkerJobSpec, status: JobStatus, group: ObservedGroup,
                     now: datetime, troubles: Mapping[str, NodeTrouble],
                     health: GroupHealth | None = None) -> Action:
    """A worker whose node has been in trouble for spec.health.nodeLostSeconds — unreachable,
    NotReady, or silent: its Lease not renewed and the worker not answering /progress — is
    lost with it: the group is dead (its collective cannot finish), so restart it as a
    disruption, long before Kubernetes would evict the pod."""
    grace = timedelta(seconds=spec.health.node_lost_seconds)
    for worker, trouble in workers_in_trouble(group, troubles, health):
        if lost_after(trouble, now, grace):
            return disruption_action(spec, status, lost_node_culprit(worker, trouble))
    return NO_ACTION


def survivor_save_grace(expected: float | None, steps_per_second: float | None,
                        cap: int) -> int:
    """How long a broken group's survivors may take to save their copy of the state: three
    of the chief's steps (status.progress.stepsPerSecond) to tell they are stuck, `expected`
    (status.progress.expectedSaveSeconds) twice over and a margin; at least
    SURVIVOR_SAVE_FLOOR_SECONDS, at most `cap` (spec.restartPolicy.survivorSaveSeconds).
    They exit as soon as the copy is complete: this bounds only a save that cannot finish."""
    if expected is None:
        return min(cap, SURVIVOR_SAVE_FLOOR_SECONDS)
    stuck = SURVIVOR_STUCK_STEPS / steps_per_second if steps_per_second else 0.0
    wanted = math.ceil(stuck + 2 * expected) + SURVIVOR_SAVE_MARGIN_SECONDS
    return min(cap, max(SURVIVOR_SAVE_FLOOR_SECONDS, wanted))


def broken_group_grace(failure: FailureRecord | None, generation: int | None,
                       own_grace: int, survivor_save: int | None = None) -> int | None:
    """The grace period for deleting a pod of group `generation` (None: the pod's own).

    A group whose end `failure` records as broken — a worker's process failed (a counted
    restart) or its node was lost — gets at most BROKEN_GROUP_GRACE_SECONDS (its own if
    shorter), or `survivor_save` (survivor_save_grace) where its survivors save their copy of
    the state on the way out (the runtime's workers, with checkpoints): that save may need
    longer than the pod's own grace, which is for a checkpoint the whole group takes on
    SIGTERM. Disruptions (an eviction, a preemption, a deleted pod) and hangs keep theirs:
    every trainer may be alive there (a stall they all share), and saving with the others."""
    if failure is None or generation is None or failure.generation != generation:
        return None
    broken = failure.reason == "NodeLost" or (
        failure.exit_code not in (None, 0) and failure.action == ActionKind.RESTART_GROUP)
    if not broken:
        return None
    return min(own_grace, BROKEN_GROUP_GRACE_SECONDS) if survivor_save is None else survivor_save


def disruption_action(spec: MultiWorkerJobSpec, status: JobStatus, culprit: Culprit) -> Action:
    """Not the job's fault: restart without spending a restart, within its own budget
    (spec.restartPolicy.maxDisruptions) — at once the first time, then backing off."""
    policy = spec.restart_policy
    if status.disruptions >= policy.max_disruptions:
        return Action(ActionKind.FAIL_JOB, Reason.DISRUPTION_LIMIT_EXCEEDED,
                      f"{culprit.description}; disruption limit reached ({status.disruptions} "
                      f"of {policy.max_disruptions} spent, spec.restartPolicy.maxDisruptions)",
                      culprit)
    delay = 0 if status.disruptions == 0 else backoff_seconds(
        max(policy.backoff_seconds, 1), policy.max_backoff_seconds, status.disruptions - 1)
    when = f"in {delay}s" if delay else "now"
    return Action(
        ActionKind.RESTART_GROUP_UNCOUNTED, Reason.WORKER_DISRUPTED,
        f"restarting group: {culprit.description}; a disruption, not counted as a restart "
        f"(disruption {status.disruptions + 1} of {policy.max_disruptions}, "
        f"{max(policy.max_restarts - status.restarts, 0)} of {policy.max_restarts} restarts "
        f"left); starting {when}", culprit, delay)


def counted_restart(spec: MultiWorkerJobSpec, status: JobStatus, culprit: Culprit,
                    reason: str = Reason.WORKER_FAILED) -> Action:
    """The job's own failure (or hang): restart, spending one of spec.restartPolicy's."""
    policy = spec.restart_policy
    if status.restarts >= policy.max_restarts:
        return Action(
            ActionKind.FAIL_JOB, Reason.RESTART_LIMIT_EXCEEDED,
            f"{culprit.description}; restart limit reached ({status.restarts} of "
            f"{policy.max_restarts} restarts spent)", culprit,
        )
    delay = backoff_seconds(policy.backoff_seconds, policy.max_backoff_seconds, status.restarts)
    when = f"in {delay}s" if delay else "now"
    return Action(
        ActionKind.RESTART_GROUP, reason,
        f"restarting group: {culprit.description}; restart {status.restarts + 1} of "
        f"{policy.max_restarts} {when}", culprit, delay,
    )


def hang_action(spec: MultiWorkerJobSpec, status: JobStatus, stall: Stall | None) -> Action:
    """A hung collective (hang.find_stall) is the job's failure: restart, spending one."""
    if stall is None:
        return NO_ACTION
    return counted_restart(spec, status, stall_culprit(stall), Reason.PROGRESS_STALLED)


def startup_action(spec: MultiWorkerJobSpec, group: ObservedGroup, now: datetime,
                   placing_since: datetime | None = None) -> Action:
    """Fail the job when a worker cannot start: at once for what waiting cannot fix, else
    after spec.health.startupTimeoutSeconds — counted from the first placement of a group
    placed again (`placing_since`, status.placingSince)."""
    timeout = spec.health.startup_timeout_seconds
    for worker in starting_workers(group):
        began = min(filter(None, (worker.since, placing_since)), default=None)
        overdue = (
            timeout is not None and began is not None
            and now - began >= timedelta(seconds=timeout)
        )
        if worker.reason in FAIL_AT_ONCE_WAITING_REASONS or overdue:
            within = f"within {timeout}s" if overdue else "and waiting will not help"
            detail = f": {worker.message}" if worker.message else ""
            culprit = Culprit(worker.index, worker.reason,
                              f"worker-{worker.index} could not start {within} "
                              f"({worker.reason}{detail})", message=worker.message,
                              since=began)
            return Action(ActionKind.FAIL_JOB, Reason.STARTUP_TIMEOUT, culprit.description,
                          culprit)
    return NO_ACTION


def replacement_action(group: ObservedGroup, troubles: Mapping[str, NodeTrouble],
                       could_host: Collection[str]) -> Action:
    """Place the group again when the scheduler refuses a worker created away from nodes
    whose Lease was silent (creation.ensure_workers) and one of them is back (not in
    `troubles`, what ails those nodes now) and could hold the group's pods at all (in
    `could_host`, fit.may_host: a returning CPU node is no reason to place a GPU group again,
    and each placement restarts its start-up clock). A pod's node affinity cannot change: a
    group that fits only with the returned node would otherwise wait until
    startupTimeoutSeconds and fail. None of it ran, so neither a restart nor a disruption is
    spent."""
    refused = [w for w in group.with_phase(WorkerPhase.PENDING) if w.avoided_nodes]
    for worker in refused:
        back = [node for node in worker.avoided_nodes
                if node not in troubles and node in could_host]
        if back:
            return Action(
                ActionKind.REPLACE_GROUP, Reason.AVOIDED_NODE_BACK,
                f"worker-{worker.index} cannot be scheduled away from "
                f"{', '.join(worker.avoided_nodes)} (Lease silent when the group was "
                f"created) and {', '.join(back)} renewed it since: placing the group again")
    if refused:
        return Action(ActionKind.WAIT, delay_seconds=AVOIDED_NODE_RECHECK_SECONDS)
    return NO_ACTION


def product_full_action(group: ObservedGroup, product: str | None, wanted: str | None,
                        free: Mapping[str, int]) -> Action:
    """Place the group again on another GPU product when the scheduler refuses a worker for
    want of GPUs on the product it was placed on — other pods took them after it was chosen —
    and another product's free GPUs (`free`: workers that fit, by product, in what other pods
    leave) hold the whole group while this one's do not. Not for a product the spec names
    (`wanted`). None of it ran: nothing is spent, and the start-up clock runs on
    (status.placingSince)."""
    if wanted is not None or product is None:
        return NO_ACTION
    short = next((w for w in group.with_phase(WorkerPhase.PENDING)
                  if f"Insufficient {GPU_RESOURCE}" in w.message), None)
    workers = len(group.workers)
    if short is None or free.get(product, 0) >= workers:
        return NO_ACTION
    roomy = sorted((p for p, n in free.items() if p != product and n >= workers),
                   key=lambda p: (-free[p], p))
    if not roomy:
        return NO_ACTION
    return Action(
        ActionKind.REPLACE_GROUP, Reason.GPU_PRODUCT_FULL,
        f"worker-{short.index} cannot be scheduled on {product} (other pods hold its GPUs) "
        f"and {roomy[0]} has room for all {workers} workers: placing the group again there")


def _chief_succeeded(group: ObservedGroup) -> Action:
    if group.workers[0].phase is WorkerPhase.SUCCEEDED:
        return Action(ActionKind.SUCCEED, Reason.CHIEF_SUCCEEDED, "worker-0 (the chief) exited 0")
    return NO_ACTION


def _all_succeeded(group: ObservedGroup) -> Action:
    if all(w.phase is WorkerPhase.SUCCEEDED for w in group.workers):
        return Action(ActionKind.SUCCEED, Reason.ALL_WORKERS_SUCCEEDED,
                      f"all {len(group.workers)} workers exited 0")
    return NO_ACTION


_SUCCESS_CHECKS: dict[SuccessPolicy, Callable[[ObservedGroup], Action]] = {
    SuccessPolicy.CHIEF_SUCCEEDED: _chief_succeeded,
    SuccessPolicy.ALL_WORKERS_SUCCEEDED: _all_succeeded,
}


def success_action(spec: MultiWorkerJobSpec, group: ObservedGroup) -> Action:
    """Succeed per spec.successPolicy. Checked before failures: once the chief is done, its
    peers exiting non-zero on the way out must not restart a finished job."""
    return _SUCCESS_CHECKS[spec.success_policy](group)


# Refusals that may pass by waiting: why, in the words of the Running condition.
PASSING_REFUSALS: dict[str, str] = {
    Reason.QUOTA_EXCEEDED: "refused by quota",
    Reason.SERVICE_ACCOUNT_MISSING: "refused: their service account does not exist (yet)",
}


def refused_start_action(spec: MultiWorkerJobSpec, status: JobStatus, now: datetime,
                         message: str, passing: str | None, worker: int = 0) -> Action:
    """The API server refused worker `worker`'s pod. A refusal that may pass (`passing`, a key
    of PASSING_REFUSALS: quota other jobs free, a service account created a moment later):
    wait with backoff until spec.health.startupTimeoutSeconds; anything else (PodSecurity, a
    webhook, a LimitRange) will not pass by waiting: fail now."""
    if passing is None:
        return Action(ActionKind.FAIL_JOB, Reason.POD_REFUSED,
                      f"the API server refused worker-{worker}'s pod: {message}")
    why = PASSING_REFUSALS[passing]
    since = status.blocked_since or now
    waited = (now - since).total_seconds()
    timeout = spec.health.startup_timeout_seconds
    if timeout is not None and waited >= timeout:
        return Action(ActionKind.FAIL_JOB, Reason.STARTUP_TIMEOUT,
                      f"worker pods {why} for {waited:.0f}s "
                      f"(spec.health.startupTimeoutSeconds): {message}")
    delay = min(max(waited / 2, 2.0), 60.0)
    return Action(ActionKind.WAIT, passing,
                  f"worker pods {why}, retrying in {delay:.0f}s: {message}",
                  delay_seconds=delay)

