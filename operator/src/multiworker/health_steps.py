"""The reconcile steps about the collective's health, from the workers' progress as last polled:
record progress and stragglers, restart a hung group; and which workers to poll next.

The progress comes in with the pass (Pass.health, collected by watch.py between passes); these
steps only read it, so a pass stays a pure function of what it is given plus cluster reads.
"""

from __future__ import annotations

from dataclasses import replace

from multiworker.conditions import Reason
from multiworker.health import GroupHealth, Targets, describe_stall, find_stall, progress_of
from multiworker.observe import WorkerPhase
from multiworker.policy import ActionKind, stall_action
from multiworker.status import TERMINAL_PHASES, Phase
from multiworker.stragglers import describe_recovered, describe_straggler, stragglers
from multiworker.transitions import NORMAL, WARNING, Flow, Pass, finish, restart_group


def record_progress(p: Pass) -> Flow:
    """status.progress from the chief's latest report; status.stragglers with an Event for
    each worker that starts or stops straggling."""
    health = _current(p)
    if health is None:
        return Flow.CONTINUE
    s, progress = p.status, progress_of(health)
    if progress is not None:
        resumed = progress.resumed_from_step
        if resumed and resumed != (s.progress.resumed_from_step if s.progress else None):
            p.emit(NORMAL, Reason.TRAINING_RESUMED,
                   f"generation {health.generation} resumed training from the checkpoint of "
                   f"step {resumed}")
        s.progress = progress
    _report_stragglers(p, health)
    return Flow.CONTINUE


def hang_policy(p: Pass) -> Flow:
    """Restart the group (spending a restart) when no worker advanced for
    spec.health.progressTimeoutSeconds; the worker that stopped first is blamed."""
    timeout = p.job.spec.health.progress_timeout_seconds
    health = _current(p)
    if timeout is None or health is None or not p.group.all_running or p.group.stale:
        return Flow.CONTINUE
    stall = find_stall(health, timeout)
    if stall is None:
        return Flow.CONTINUE
    worker = replace(p.group.workers[stall.first.index], reason=Reason.PROGRESS_STALLED,
                     message=describe_stall(stall), since=stall.stopped_at)
    action = stall_action(p.job.spec, p.status, worker)
    if action.kind is ActionKind.FAIL_JOB:
        finish(p, Phase.FAILED, action)
    else:
        restart_group(p, action)
    return Flow.DONE


def probe_targets(p: Pass) -> Targets | None:
    """The running workers of the current group, while the job runs (or starts)."""
    s, group, health = p.status, p.group, p.job.spec.health
    if p.deleted or p.outdated or s.phase in TERMINAL_PHASES or s.phase is Phase.SUSPENDED:
        return None
    if group.generation != s.group_generation:
        return None  # this pass moved on to a new group: its pods do not exist yet
    workers = tuple((w.index, w.ip) for w in group.workers
                    if w.phase is WorkerPhase.RUNNING and w.ip and not w.terminating)
    if not workers:
        return None
    return Targets(
        generation=s.group_generation, port=health.progress_port, workers=workers,
        all_running=group.all_running and not group.stale,
        progress_timeout=health.progress_timeout_seconds,
        straggler_threshold=health.straggler_threshold,
    )


def _current(p: Pass) -> GroupHealth | None:
    """The polled health, if it is about the group this pass sees."""
    generation = p.status.group_generation
    health = p.health
    if health is None or health.generation != generation or p.group.generation != generation:
        return None
    return health


def _report_stragglers(p: Pass, health: GroupHealth) -> None:
    threshold = p.job.spec.health.straggler_threshold
    old, new = set(p.status.stragglers), set(stragglers(health))
    for index in sorted(new - old):
        p.emit(WARNING, Reason.STRAGGLER, describe_straggler(health, index, threshold or 0))
        p.log.warning("worker-%d is straggling", index)
    for index in sorted(old - new):
        p.emit(NORMAL, Reason.STRAGGLER_RECOVERED, describe_recovered(health, index))
    p.status.stragglers = sorted(new)
