"""The phase, decided in one place from what the pass established: conditions, the restart
in progress and the observed group. Steps never set it; commit.py calls `phase_of` just
before the status is written."""

from __future__ import annotations

from multiworker.api.conditions import Type, is_true
from multiworker.api.status import JobStatus, Phase
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.workers import WorkerPhase


def phase_of(status: JobStatus, group: ObservedGroup, suspended: bool) -> Phase:
    if is_true(status.conditions, Type.SUCCEEDED):
        return Phase.SUCCEEDED
    if is_true(status.conditions, Type.FAILED):
        return Phase.FAILED
    if suspended:
        return Phase.SUSPENDED
    if is_true(status.conditions, Type.QUEUED):
        return Phase.QUEUED
    current = group.generation == status.group_generation
    if current and group.all_running and not group.stale:
        return Phase.RUNNING
    if status.recovering_since is not None:
        return Phase.RESTARTING
    waiting = group.with_phase(WorkerPhase.PENDING, WorkerPhase.MISSING)
    return Phase.PENDING if not current or waiting or group.stale else Phase.STARTING
