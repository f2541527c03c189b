from __future__ import annotations

from multiworker.clients import metrics


def value(phase: str) -> float:
    return float(metrics.JOBS.labels(phase=phase)._value.get())  # type: ignore[attr-defined]


def test_jobs_by_phase_counts_each_job_once() -> None:
    """(Other tests' jobs stay counted in the process-wide gauge: only changes are compared.)"""
    before = (value("Running"), value("Restarting"), value("Failed"))
    metrics.set_job_phase("t", "a", "Running")
    metrics.set_job_phase("t", "b", "Running")
    metrics.set_job_phase("t", "a", "Restarting")
    assert (value("Running") - before[0], value("Restarting") - before[1]) == (1, 1)
    metrics.set_job_phase("t", "a", None)
    metrics.set_job_phase("t", "b", None)
    assert (value("Running"), value("Restarting"), value("Failed")) == before
