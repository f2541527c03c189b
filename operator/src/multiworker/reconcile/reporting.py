"""What a pass records from the workers' progress (polled between passes by poller.py):
status.progress, stragglers, whether progress can be read at all (the ProgressReporting
condition); and which workers the poller should poll next. The hang rule is hang.py."""

from __future__ import annotations

from multiworker.api.conditions import Reason, Status, Type, find
from multiworker.api.status import TERMINAL_PHASES, ProgressStatus
from multiworker.clients import metrics
from multiworker.decide import history
from multiworker.decide.hang import inactive_reason
from multiworker.decide.nodes import HEARTBEAT_STALE
from multiworker.decide.progress import (
    TRAINING,
    GroupHealth,
    Targets,
    final_progress,
    progress_of,
)
from multiworker.decide.stragglers import describe_recovered, describe_straggler, stragglers
from multiworker.decide.workers import WorkerPhase
from multiworker.reconcile.context import Flow, Pass


def current_health(p: Pass) -> GroupHealth | None:
    """The polled health, if it is about the group this pass sees."""
    generation = p.status.group_generation
    health = p.health
    if health is None or health.generation != generation or p.group.generation != generation:
        return None
    return health


def record_progress(p: Pass) -> Flow:
    """status.progress from the chief's latest report; stragglers with an Event each way;
    the ProgressReporting condition."""
    health = current_health(p)
    final = _final_progress(p)
    if final is not None:
        p.status.progress = final  # the chief's own last words beat the last poll
    if health is None:
        return Flow.CONTINUE
    s, progress = p.status, final or progress_of(health)
    if progress is not None:
        resumed = progress.resumed_from_step
        if resumed and resumed != (s.progress.resumed_from_step if s.progress else None):
            origin = progress.resumed_from or "checkpoint"
            where = f"from the checkpoint of step {resumed}" if origin == "checkpoint" else \
                f"at step {resumed}, saved by {origin} when a peer failed"
            p.emit(Reason.TRAINING_RESUMED,
                   f"generation {health.generation} resumed training {where}"
                   + _count_steps_lost(p, health.generation, resumed))
        if resumed is not None:
            s.history = history.resumed(s.history, health.generation, resumed)
        s.progress = progress
    _report_stragglers(p, health)
    _report_readability(p, health)
    _report_blocked_peers(p, health)
    return Flow.CONTINUE


def _count_steps_lost(p: Pass, generation: int, resumed: int) -> str:
    """Records in status.lastFailure what the failure before `generation` cost, in steps
    (and the metric); the words for the Event."""
    failure = p.status.last_failure
    if failure is None or failure.last_step is None or failure.steps_lost is not None \
            or failure.generation >= generation:
        return ""
    lost = max(0, failure.last_step - resumed)
    p.status.last_failure = failure.model_copy(update={"steps_lost": lost})
    p.status.history = history.lost(p.status.history, failure.generation, lost)
    p.after_write.append(lambda: metrics.STEPS_LOST.inc(lost))
    steps = "step" if lost == 1 else "steps"
    return f"; {lost} {steps} lost (the last step done was {failure.last_step})"


def _final_progress(p: Pass) -> ProgressStatus | None:
    """The chief's final report, once it exited 0 (left as its termination message)."""
    chief = next(iter(p.group.workers), None)
    if chief is None or chief.phase is not WorkerPhase.SUCCEEDED:
        return None
    return final_progress(chief.message)


def _report_blocked_peers(p: Pass, health: GroupHealth) -> None:
    """A starting worker whose connects to a peer's port time out (packets dropped) says so
    long before its peer timeout: likely a firewall or NetworkPolicy (docs/contracts.md)."""
    blocked = [(w.index, peer) for w in health.workers if w.report is not None
               for peer in w.report.peers if peer.state == "dropped"]
    old = find(p.job.status.conditions, Type.PEERS_REACHABLE)
    if blocked:
        index, peer = blocked[0]
        more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
        message = (f"worker-{index} cannot reach worker-{peer.worker} at {peer.address} "
                   f"({peer.endpoint} port): {peer.detail or 'packets are dropped'}{more}; "
                   "likely a firewall or NetworkPolicy; the workers keep waiting up to "
                   "spec.health.peerTimeoutSeconds")
        if old is None or old.status != "False":
            p.emit(Reason.PORT_BLOCKED, message)
        p.condition(Type.PEERS_REACHABLE, "False", Reason.PORT_BLOCKED, message)
    elif old is not None and old.status == "False" and all(
            w.report is not None and w.report.phase != "waiting-for-peers"
            for w in health.workers):
        p.condition(Type.PEERS_REACHABLE, "True", Reason.PEERS_CONNECTED,
                    "every worker reached its peers")


def _report_readability(p: Pass, health: GroupHealth) -> None:
    spec = p.job.spec.health
    p.status.bad_progress_reports = health.bad_reports
    inactive = inactive_reason(health, spec.progress_timeout_seconds, spec.progress_port)
    bad = [w for w in health.workers if w.bad_reports]
    status: Status
    if inactive is not None:
        reason, status, message = Reason.NO_PROGRESS_SERVER, "False", inactive
    elif bad:
        w = bad[0]
        reason, status = Reason.BAD_PROGRESS_REPORTS, "False"
        message = (f"worker-{w.index} answered GET /progress with something that is not its "
                   f"report ({w.last_bad}); {health.bad_reports} unreadable answers from this "
                   "group; hang detection judges it as not answering")
    elif health.ever_reported:
        reason, status = Reason.PROGRESS_REPORTED, "True"
        message = f"workers of generation {health.generation} report their progress"
    else:
        return
    old = find(p.job.status.conditions, Type.PROGRESS_REPORTING)
    if status == "False" and (old is None or old.reason != reason):
        p.emit(reason, message)
    p.condition(Type.PROGRESS_REPORTING, status, reason, message)


def _report_stragglers(p: Pass, health: GroupHealth) -> None:
    threshold = p.job.spec.health.straggler_threshold
    old, new = set(p.status.stragglers or ()), set(stragglers(health))
    for index in sorted(new - old):
        p.emit(Reason.STRAGGLER, describe_straggler(health, index, threshold or 0))
        p.log.warning("worker-%d is straggling", index)
    for index in sorted(old - new):
        p.emit(Reason.STRAGGLER_RECOVERED, describe_recovered(health, index))
    p.status.stragglers = sorted(new) or None


def poll_targets(p: Pass) -> Targets | None:
    """The running workers of the current group, while the job runs (or starts): all of them
    while they start (any may report an unreachable peer) and when hang or straggler detection
    compares them; else the chief alone."""
    s, group, health = p.status, p.group, p.job.spec.health
    if p.deleted or p.outdated or s.phase in TERMINAL_PHASES or p.job.spec.suspend:
        return None
    if group.generation != s.group_generation:
        return None  # this pass moved on to a new group: its pods do not exist yet
    running = [w for w in group.workers
               if w.phase is WorkerPhase.RUNNING and w.ip and not w.terminating]
    if health.progress_timeout_seconds is None and health.straggler_threshold is None \
            and _chief_training(p.health):
        # Nothing compares workers and the collective has formed (no peer left to report
        # unreachable): status.progress is the chief's alone, so only the chief is polled —
        # and any worker whose node's Lease went silent: its answer tells a node that is up
        # (its kubelet alone is not) from a lost one (policy.lost_node_action).
        silent = {node for node, t in p.troubles.items() if t.reason == HEARTBEAT_STALE}
        running = [w for w in running if w.index == 0 or w.node in silent]
    workers = tuple((w.index, w.ip) for w in running)
    if not workers:
        return None
    # The port the group's pods were created with (health.progressPort may have been edited
    # since: that takes effect with the next group).
    port = next((w.progress_port for w in group.workers if w.progress_port),
                health.progress_port)
    return Targets(
        generation=s.group_generation, port=port, workers=workers,
        all_running=group.all_running and not group.stale,
        progress_timeout=health.progress_timeout_seconds,
        straggler_threshold=health.straggler_threshold,
    )


def _chief_training(health: GroupHealth | None) -> bool:
    chief = health.worker(0) if health is not None else None
    return chief is not None and chief.report is not None and chief.report.phase == TRAINING
