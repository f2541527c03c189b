"""Pure straggler rule: a worker whose steps per second stay below spec.health.stragglerThreshold
times the group's median for several polls in a row. Reported, never restarted.

In synchronous training (MultiWorkerMirroredStrategy) every step waits for the slowest worker,
so the rates the workers report converge; a straggler shows mostly while rates are settling
or when a worker's window covers a stall the others did not see.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from multiworker.decide.progress import TRAINING, GroupHealth, WorkerTrack

# A worker is a straggler after this many polls in a row below the threshold, and stops being
# one after as many at or above it (no flapping on one slow poll).
STRAGGLER_POLLS = 3


def mark_stragglers(health: GroupHealth, threshold: float | None) -> GroupHealth:
    """Count each training worker's polls below `threshold` × the median steps/s; workers
    that do not answer or are not training keep their counts."""
    if threshold is None:
        return replace(health, median_rate=None, workers=tuple(
            replace(w, slow_polls=0, fast_polls=0, straggling=False) for w in health.workers))
    rates = {w.index: w.report.steps_per_second for w in health.workers
             if w.report is not None and w.report.steps_per_second is not None and _measured(w)}
    if len(rates) < 2:
        return replace(health, median_rate=None)
    median = statistics.median(rates.values())
    marked = []
    for w in health.workers:
        if w.index in rates:
            slow = rates[w.index] < threshold * median
            w = replace(w, slow_polls=w.slow_polls + 1 if slow else 0,
                        fast_polls=0 if slow else w.fast_polls + 1)
            if w.slow_polls >= STRAGGLER_POLLS or w.fast_polls >= STRAGGLER_POLLS:
                w = replace(w, straggling=slow)
        marked.append(w)
    return replace(health, workers=tuple(marked), median_rate=median)


def _measured(w: WorkerTrack) -> bool:
    """Answering, training and past its first step."""
    r = w.report
    return w.answering and r is not None and r.phase == TRAINING and r.updated_at is not None


def stragglers(health: GroupHealth | None) -> list[int]:
    return [w.index for w in health.workers if w.straggling] if health is not None else []


def describe_straggler(health: GroupHealth, index: int, threshold: float) -> str:
    return (f"worker-{index} is straggling: {_rate(health, index)} steps/s, below "
            f"{threshold:g} × the group's median of {health.median_rate or 0:.3g} steps/s for "
            f"{STRAGGLER_POLLS} polls in a row (spec.health.stragglerThreshold); not restarting")


def describe_recovered(health: GroupHealth | None, index: int) -> str:
    if health is None or health.worker(index) is None:
        return f"worker-{index} is no longer straggling: its group was replaced"
    return (f"worker-{index} is no longer straggling: {_rate(health, index)} steps/s, group "
            f"median {health.median_rate or 0:.3g} steps/s")


def _rate(health: GroupHealth, index: int) -> str:
    w = health.worker(index)
    rate = w.report.steps_per_second if w is not None and w.report is not None else None
    return f"{rate:.3g}" if rate is not None else "?"
