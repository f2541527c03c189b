"""Prometheus metrics (served by `multiworker-operator --metrics-port`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from multiworker.api.status import Phase

# Seconds: from a few (small CPU jobs) to an hour (large images, slow schedulers).
_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)

JOBS = Gauge("multiworker_jobs", "MultiWorkerJobs handled by this operator, by phase.", ["phase"])
GROUP_RESTARTS = Counter(
    "multiworker_group_restarts_total",
    "Whole-group restarts, by the first failed worker's reason (OOMKilled, Error, Evicted, "
    "Deleted, ...) and whether the restart spent the job's budget.",
    ["reason", "counted"],
)
STEPS_LOST = Counter(
    "multiworker_steps_lost_total",
    "Training steps a failure cost: trained before it, trained again by the next group.",
)
STARTUP_SECONDS = Histogram(
    "multiworker_startup_seconds",
    "Time from a job's creation to all workers of its first group running.",
    buckets=_BUCKETS,
)
RECOVERY_SECONDS = Histogram(
    "multiworker_recovery_seconds",
    "Time from a failure observed to all workers of the new group running.",
    buckets=_BUCKETS,
)
RECONCILE_ERRORS = Counter(
    "multiworker_reconcile_errors_total", "Reconcile passes that failed and will be retried."
)

API_REQUESTS = Counter(
    "multiworker_api_requests_total",
    "Requests this operator sent to the Kubernetes API server, by verb, resource and HTTP code.",
    ["verb", "resource", "code"],
)
WATCH_BYTES = Counter(
    "multiworker_watch_bytes_total",
    "Bytes of watch events this operator received, by resource: what every pod's size costs "
    "it in reads and JSON decoding.",
    ["resource"],
)
WATCH_EVENTS = Counter(
    "multiworker_watch_events_total", "Watch events this operator received, by resource.",
    ["resource"],
)
LEADING = Gauge(
    "multiworker_leading_namespaces",
    "Namespaces whose jobs this instance handles (it holds their Lease); 0 while another "
    "instance leads.",
)
PASS_SECONDS = Histogram(
    "multiworker_reconcile_seconds", "Duration of one reconcile pass.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BAD_PROGRESS_REPORTS = Counter(
    "multiworker_bad_progress_reports_total",
    "Progress reports that could not be read (too large, malformed, wrong schema).",
)
NAMESPACE_LEADING = Gauge(
    "multiworker_namespace_leading",
    "Per namespace with jobs: 1 while this instance holds its Lease and handles its jobs, 0 "
    "while it waits for another instance (every instance 0: nobody handles them).",
    ["job_namespace"],
)
WORKQUEUE_DEPTH = Gauge(
    "multiworker_workqueue_depth",
    "Jobs due for a reconcile pass and waiting for a free pass worker (timers not yet due "
    "are not counted): a backlog that stays means passes cannot keep up.",
)

# Per-job series, from the job's status as the handling instance last wrote or read it (the
# status is the record; these mirror it). Labelled job_namespace and job_name: `namespace`
# and `job` are the labels Prometheus gives the scrape target itself. Only the instance that
# handles a job exports them, and they go with the job (or with the namespace's Lease).
_JOB = ("job_namespace", "job_name")
JOB_PHASE = Gauge("multiworker_job_phase", "1 for a job's current phase (status.phase).",
                  [*_JOB, "phase"])
JOB_RESTARTS = Gauge(
    "multiworker_job_restarts",
    "Group restarts a job has spent from spec.restartPolicy.maxRestarts (status.restarts).",
    _JOB)
JOB_WORKERS = Gauge(
    "multiworker_job_workers",
    "Workers of a job's current group (status.totalWorkers: fewer than spec.workers while an "
    "elastic job is shrunk).", _JOB)
JOB_RESIZES = Gauge(
    "multiworker_job_resizes",
    "Times an elastic job's group was made smaller or larger (status.resizes).", _JOB)
JOB_READY_WORKERS = Gauge(
    "multiworker_job_ready_workers",
    "Workers of a job's current group that run and are ready (status.readyWorkers).", _JOB)
JOB_PROGRESS_STEP = Gauge(
    "multiworker_job_progress_step",
    "The chief's latest training step (status.progress.step); absent until it reports one.",
    _JOB)
_PER_JOB: tuple[tuple[Gauge, Callable[[Mapping[str, Any]], Any]], ...] = (
    (JOB_RESTARTS, lambda s: s.get("restarts", 0)),
    (JOB_WORKERS, lambda s: s.get("totalWorkers")),
    (JOB_RESIZES, lambda s: s.get("resizes") or 0),
    (JOB_READY_WORKERS, lambda s: s.get("readyWorkers", 0)),
    (JOB_PROGRESS_STEP, lambda s: (s.get("progress") or {}).get("step")),
)

_lock = threading.Lock()
_phases: dict[tuple[str, str], str] = {}
_counts: dict[str, int] = {}


def set_job_phase(namespace: str, name: str, phase: str | None) -> None:
    """Remember one job's phase (None forgets the job) and move the per-phase gauge; every
    pass calls this, so it costs nothing when the phase is unchanged (a recount of every job
    was O(jobs) per pass)."""
    key = (namespace, name)
    with _lock:
        old = _phases.get(key)
        if old == phase:
            return
        if phase is None:
            del _phases[key]
        else:
            _phases[key] = phase
        for value, delta in ((old, -1), (phase, +1)):
            if value is not None:
                _counts[value] = _counts.get(value, 0) + delta
                JOBS.labels(phase=value).set(_counts[value])


_job_phases: dict[tuple[str, str], str | None] = {}  # the jobs with series, their phase


def set_job_status(namespace: str, name: str, status: Mapping[str, Any] | None) -> None:
    """Export one job's series from its status (camelCase, as stored); None drops them."""
    key = (namespace, name)
    with _lock:
        old = _job_phases.pop(key, None) if status is None else _job_phases.get(key)
        phase = None if status is None else status.get("phase")
        if old != phase and old is not None:
            _drop(JOB_PHASE, namespace, name, old)
        if status is None:
            for gauge, _ in _PER_JOB:
                _drop(gauge, namespace, name)
            return
        _job_phases[key] = phase
        if phase is not None:
            JOB_PHASE.labels(namespace, name, phase).set(1)
        for gauge, read in _PER_JOB:
            value = read(status)
            if isinstance(value, int | float):
                gauge.labels(namespace, name).set(value)
            else:
                _drop(gauge, namespace, name)


def forget_jobs_in(namespace: str) -> None:
    """Drop the series of every job of `namespace` (this instance no longer handles them)."""
    with _lock:
        keys = [key for key in _job_phases if key[0] == namespace]
    for key in keys:
        set_job_status(*key, None)


def set_namespaces_leading(leading: Mapping[str, bool]) -> None:
    """Whether this instance leads each namespace with jobs; other namespaces' series go."""
    with _lock:
        for (namespace,) in _labelsets(NAMESPACE_LEADING):
            if namespace not in leading:
                _drop(NAMESPACE_LEADING, namespace)
        for namespace, leads in leading.items():
            NAMESPACE_LEADING.labels(namespace).set(1 if leads else 0)


def _labelsets(gauge: Gauge) -> list[tuple[str, ...]]:
    return [tuple(sample.labels.values()) for metric in gauge.collect()
            for sample in metric.samples]


def _drop(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


class _Tables:
    """multiworker_tracked_entries, read at each scrape from the function `track_tables`
    gives it (no update per pass)."""

    sizes: Callable[[], Mapping[str, int]] = staticmethod(dict)

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            "multiworker_tracked_entries",
            "Entries of each of the operator's per-object tables: each follows the objects "
            "that exist now (jobs, pods, nodes), never all the jobs it has seen.",
            labels=["table"])
        for table, size in sorted(self.sizes().items()):
            family.add_metric([table], size)
        yield family


_TABLES = _Tables()
REGISTRY.register(_TABLES)


def track_tables(sizes: Callable[[], Mapping[str, int]]) -> None:
    """Export the sizes `sizes()` reports (the controller's tables) at every scrape."""
    _TABLES.sizes = sizes


def tracked_series() -> int:
    """How many per-job series this process exports now (the jobs it handles)."""
    with _lock:
        return len(_job_phases)


for _phase in Phase:  # every phase exported (as 0) from the first scrape on
    JOBS.labels(phase=_phase.value).set(0)


def serve(port: int) -> None:
    start_http_server(port)
