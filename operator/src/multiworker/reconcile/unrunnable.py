"""Jobs the reconcile steps cannot run on: a status the operator cannot read (it acts on
nothing, only says so) and a spec it cannot run (its pods go, the job fails naming every
field). Both write status through commit.py like every pass."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from multiworker.api.conditions import Reason, Type, find, set_condition
from multiworker.api.status import JobStatus, Phase, parse_status
from multiworker.clients.writes import Conflict, PodDeletion
from multiworker.decide.ownership import controlled_by
from multiworker.logs import job_logger
from multiworker.reconcile.commit import emit, write
from multiworker.reconcile.context import ClusterIO, Outcome
from multiworker.reconcile.events import event_type

Manifest = dict[str, Any]


def refuse_unreadable_status(cluster: ClusterIO, body: Manifest, problems: list[str],
                             now: datetime) -> Outcome:
    """Never act on a status we cannot read: no pod is created or deleted, nothing is reset.
    Only the StatusUnreadable condition (and one Event) say why."""
    meta = body["metadata"]
    message = ("the operator cannot read this job's status and will not act on it until it "
               "is fixed (pods are kept): " + "; ".join(problems)[:800])
    raw = (body.get("status") or {}).get("conditions")
    try:
        conditions = JobStatus.model_validate({"conditions": raw or []}).conditions
    except ValueError:
        conditions = []
    old = find(conditions, Type.STATUS_UNREADABLE)
    if old is not None and old.message == message and old.status == "True":
        return Outcome()
    conditions = set_condition(conditions, Type.STATUS_UNREADABLE, "True",
                               Reason.STATUS_UNREADABLE, message, now)
    fields = {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conditions]}
    try:
        write(cluster, body, fields)
    except Conflict:
        return Outcome(requeue=0)
    emit(cluster, body, [(event_type(Reason.STATUS_UNREADABLE), Reason.STATUS_UNREADABLE,
                          message)], now)
    job_logger(meta["namespace"], meta["name"]).error("%s", message)
    return Outcome()


def fail_invalid_spec(cluster: ClusterIO, body: Manifest, problems: list[str],
                      now: datetime) -> Outcome:
    """A spec the CRD let through but the operator cannot run (or one changed while the job
    ran): delete its pods — they hold GPUs — and fail, once, with every problem named."""
    meta = body["metadata"]
    uid = meta.get("uid", "")
    doomed = [PodDeletion(meta["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"])
              for pod in cluster.cached_pods(meta["namespace"], meta["name"])
              if controlled_by(pod["metadata"], uid)
              and not pod["metadata"].get("deletionTimestamp")]
    cluster.delete_pods(doomed)
    status = parse_status(body.get("status"))
    if find(status.conditions, Type.FAILED) is not None and status.phase is Phase.FAILED:
        return Outcome()
    message = "invalid spec: " + "; ".join(problems)
    status.phase, status.completion_time = Phase.FAILED, now
    status.restart_after = status.recovering_since = status.blocked_since = None
    status.conditions = set_condition(status.conditions, Type.FAILED, "True",
                                      Reason.INVALID_SPEC, message, now)
    try:
        write(cluster, body, status.model_dump(mode="json", by_alias=True))
    except Conflict:
        return Outcome(requeue=0)
    emit(cluster, body, [(event_type(Reason.INVALID_SPEC), Reason.INVALID_SPEC, message)], now)
    job_logger(meta["namespace"], meta["name"]).warning("%s", message)
    return Outcome()
