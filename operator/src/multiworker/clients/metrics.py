"""Prometheus metrics (served by `multiworker-operator --metrics-port`)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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


for _phase in Phase:  # every phase exported (as 0) from the first scrape on
    JOBS.labels(phase=_phase.value).set(0)


def serve(port: int) -> None:
    start_http_server(port)
