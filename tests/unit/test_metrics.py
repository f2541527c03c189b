from __future__ import annotations

from multiworker.clients import metrics
from prometheus_client import REGISTRY


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


def samples(name: str) -> dict[tuple[str, ...], float]:
    """Every sample of one metric family, by its label values."""
    found = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def test_a_jobs_series_follow_its_status_and_go_with_it() -> None:
    status = {"phase": "Running", "restarts": 2, "totalWorkers": 4, "readyWorkers": 3,
              "resizes": 1}
    metrics.set_job_status("m", "a", status)
    assert samples("multiworker_job_phase")[("m", "a", "Running")] == 1
    assert samples("multiworker_job_restarts")[("m", "a")] == 2
    assert samples("multiworker_job_workers")[("m", "a")] == 4
    assert samples("multiworker_job_ready_workers")[("m", "a")] == 3
    assert samples("multiworker_job_resizes")[("m", "a")] == 1
    assert ("m", "a") not in samples("multiworker_job_progress_step")  # no report yet

    metrics.set_job_status("m", "a", {**status, "phase": "Restarting", "progress": {"step": 7}})
    assert ("m", "a", "Running") not in samples("multiworker_job_phase")  # one phase at a time
    assert samples("multiworker_job_phase")[("m", "a", "Restarting")] == 1
    assert samples("multiworker_job_progress_step")[("m", "a")] == 7

    metrics.set_job_status("m", "b", status)
    metrics.forget_jobs_in("m")  # leadership lost: the new leader exports them
    for name in ("multiworker_job_phase", "multiworker_job_restarts",
                 "multiworker_job_progress_step"):
        assert not [k for k in samples(name) if k[0] == "m"], name


def test_namespaces_leading_keep_only_the_namespaces_with_jobs() -> None:
    metrics.set_namespaces_leading({"x": True, "y": False})
    assert samples("multiworker_namespace_leading") == {("x",): 1, ("y",): 0}
    metrics.set_namespaces_leading({"y": True})
    assert samples("multiworker_namespace_leading") == {("y",): 1}
    metrics.set_namespaces_leading({})
    assert samples("multiworker_namespace_leading") == {}
