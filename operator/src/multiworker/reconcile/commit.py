"""What is written to a job's status, and the one place it is written: once per pass, only
when it changed, then the pass's Events (never before the write succeeded) and metrics."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from multiworker.api.status import JobStatus
from multiworker.clients import metrics
from multiworker.decide.phase import phase_of
from multiworker.logs import job_logger
from multiworker.reconcile.context import ClusterIO, Pass

Manifest = dict[str, Any]


def dump(status: JobStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True)


def commit(p: Pass) -> Manifest | None:
    """Finish the new status (counts, phase), write it if it changed, then emit the Events;
    the job as it is after our write (None: nothing written)."""
    if p.deleted:
        metrics.set_job_phase(p.job.namespace, p.job.name, None)
        return None
    if p.outdated:
        return None
    s, spec = p.status, p.job.spec
    ready = p.group.ready if p.group.generation == s.group_generation else 0
    s.total_workers, s.ready_workers, s.ready = spec.workers, ready, f"{ready}/{spec.workers}"
    s.size = f"{spec.workers}/{p.job.max_workers}" if spec.elastic else None
    s.observed_generation = p.job.generation
    s.phase = phase_of(s, p.group, spec.suspend)
    written = None
    new, old = dump(s), dump(p.job.status)
    later = _progress_wait_until(p, old, new) if new != old else None
    if later is not None:
        p.wake_at(later)
    elif new != old:
        version = write(p.cluster, p.body, new)
        written = {**p.body, "metadata": {**p.body["metadata"], "resourceVersion": version},
                   "status": {k: v for k, v in new.items() if v is not None}}
    emit(p.cluster, p.body, p.events, p.now)
    for record in p.after_write:
        record()
    metrics.set_job_phase(p.job.namespace, p.job.name, s.phase)
    return written


# A change of progress alone waits this long after the last write: counts (ready 37/64 ->
# 41/64), the Running condition's reason and message (which worker it names, "creating 8
# workers" -> "worker-1 is starting"), the phase between Pending and Starting. A 256-worker
# group starting wrote ~30 statuses that differed in nothing else, and a restart of 8 wrote
# five where two say what matters. Anything else (a phase that ends the wait: Running,
# Restarting, a failure; a condition that flips; a new generation) is written at once.
PROGRESS_WRITE_INTERVAL = timedelta(seconds=1)
WAITING_PHASES = ("Pending", "Starting")


def _progress_wait_until(p: Pass, old: Manifest, new: Manifest) -> datetime | None:
    """When to write `new`, if it differs from `old` only in progress and the last write
    was too recent; None: now."""
    if p.last_write is None or p.now - p.last_write >= PROGRESS_WRITE_INTERVAL or p.events \
            or p.after_write or _without_progress(old) != _without_progress(new):
        return None
    return p.last_write + PROGRESS_WRITE_INTERVAL


def _without_progress(status: Manifest) -> Manifest:
    masked = {k: v for k, v in status.items() if k not in ("ready", "readyWorkers")}
    if masked.get("phase") in WAITING_PHASES:
        masked["phase"] = WAITING_PHASES
    masked["conditions"] = [{**c, "reason": "", "message": ""} if c.get("type") == "Running"
                            else c for c in status.get("conditions") or []]
    return masked


def write(cluster: ClusterIO, body: Manifest, fields: Manifest) -> str:
    """Merge-patch status `fields` (null clears one), only if the job is unchanged since it
    was read (k8s.Conflict otherwise)."""
    meta = body["metadata"]
    return cluster.patch_job_status(meta["namespace"], meta["name"], fields,
                                    meta["resourceVersion"])


def emit(cluster: ClusterIO, body: Manifest, events: list[tuple[str, str, str]],
         now: datetime) -> None:
    """Best effort: status is the record, Events are commentary. An Event the API server does
    not take (a timeout, a quota on events, a 5xx) is logged and the pass goes on; it must not
    fail a pass whose status write already succeeded (the pass would run again and act twice).
    """
    for type_, reason, message in events:
        try:
            cluster.emit_event(body, type_, reason, message, now)
        except Exception as e:  # any failure of a best-effort side effect
            meta = body["metadata"]
            job_logger(meta["namespace"], meta["name"]).warning(
                "could not record the %s Event (%s): %s", reason, message[:200], e)
