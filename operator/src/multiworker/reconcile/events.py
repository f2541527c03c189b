"""Which Events are Warnings — the one rule, for every Event the operator emits."""

from __future__ import annotations

import re

from multiworker.api.conditions import Reason
from multiworker.decide.workers import PROBLEM_WAITING_REASONS

NORMAL, WARNING = "Normal", "Warning"

_WARNING_REASONS = frozenset({
    Reason.WORKER_FAILED, Reason.WORKER_DISRUPTED, Reason.PROGRESS_STALLED,
    Reason.EVICTED_FOR_USAGE, Reason.RESTART_LIMIT_EXCEEDED, Reason.DISRUPTION_LIMIT_EXCEEDED,
    Reason.REPEATED_STARTUP_ERROR,
    Reason.EXIT_CODE_FAILS_JOB, Reason.STARTUP_TIMEOUT, Reason.INVALID_SPEC,
    Reason.INVALID_POD_TEMPLATE, Reason.POD_REFUSED, Reason.QUOTA_EXCEEDED,
    Reason.SERVICE_ACCOUNT_MISSING, Reason.IN_PLACE_ABANDONED,
    Reason.UNSCHEDULABLE, Reason.OBJECT_CONFLICT, Reason.STRAGGLER, Reason.STATUS_UNREADABLE,
    Reason.NO_PROGRESS_SERVER, Reason.BAD_PROGRESS_REPORTS, Reason.STALE_POD_FORCE_DELETED,
    Reason.RECONCILE_ERROR, Reason.PORT_BLOCKED, Reason.IMAGE_SKEW, Reason.NO_GPU_PRODUCT,
    Reason.GANG_UNAVAILABLE, Reason.KUEUE_DISABLED, Reason.KUEUE_NOT_INSTALLED,
    Reason.WORKLOAD_REFUSED, Reason.EVICTED, Reason.SHRUNK,
}) | PROBLEM_WAITING_REASONS


def event_type(reason: str) -> str:
    """Warning for what someone should look at (a failure, a refusal, a stuck start), else
    Normal."""
    return WARNING if reason in _WARNING_REASONS else NORMAL


def is_problem(reason: str) -> bool:
    """A why-not-running reason worth an Event of its own whenever its gist changes."""
    return event_type(reason) == WARNING


_NUMBER = re.compile(r"\d+")


def gist(message: str) -> str:
    """A message with its numbers blanked. A why-not-running Event is emitted when the gist
    changes, not when a count moves: a 256-worker group starting on tight nodes wrote ~30
    "N of 256 workers cannot be scheduled" Events in 4 s, one per pass."""
    return _NUMBER.sub("#", message)
