"""What a pass asks the API server to write, and what it gets back, in words a pass acts on:
the deletions and patches of pods (one pod by uid, or a generation by label selector), and
an answer — created, already there, refused (invalid, forbidden, over quota, a missing service
account), a conflict, or gone. kube.py makes the calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from kubernetes.client.exceptions import ApiException


class Created(StrEnum):
    CREATED = "Created"
    EXISTS = "Exists"  # 409: it was there already; the caller checks who controls it


class RefusalKind(StrEnum):
    """Why the API server refused to create an object — each calls for a different answer."""

    INVALID = "Invalid"  # 400/422: the object itself is wrong; retrying cannot help
    FORBIDDEN = "Forbidden"  # 403: admission (PodSecurity, a webhook, LimitRange) said no
    QUOTA = "QuotaExceeded"  # 403 from ResourceQuota: may pass once other pods finish
    # 403 from ServiceAccount admission: a new namespace's "default" comes a moment after the
    # namespace, and `kubectl apply -f dir/` may create the job before its account
    SERVICE_ACCOUNT = "ServiceAccountMissing"


class Refused(Exception):
    """The API server refused to create an object; `message` is the server's own words."""

    def __init__(self, kind: RefusalKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Conflict(Exception):
    """The object changed since we read it (optimistic concurrency): read again."""


class Gone(Exception):
    """The object no longer exists (404 on an update)."""


def server_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


def refusal_kind(status: int, message: str) -> RefusalKind | None:
    """Which refusal a failed create is (None: not a refusal, e.g. 500 or a timeout)."""
    if status in (400, 422):
        return RefusalKind.INVALID
    if status == 403:
        if "exceeded quota" in message:
            return RefusalKind.QUOTA
        if "error looking up service account" in message:
            return RefusalKind.SERVICE_ACCOUNT
        return RefusalKind.FORBIDDEN
    return None


@dataclass(frozen=True)
class PodDeletion:
    namespace: str
    name: str
    uid: str  # only this pod, never a newer one of the same name
    grace: int | None = None  # None: the pod's own terminationGracePeriodSeconds


@dataclass(frozen=True)
class GenerationDeletion:
    """The pods of one generation of a job, deleted by label selector in a few calls instead of
    one per pod (Cluster.delete_generation): a restart of 1,024 workers was ~1,024 DELETEs."""

    namespace: str
    job: str
    generation: int
    pods: tuple[PodDeletion, ...]  # each with its worker index in `indexes`, same order
    indexes: tuple[int, ...]
    grace: int | None = None  # None: each pod's own terminationGracePeriodSeconds
    # Pods carrying this generation's labels to leave alone, by name: already terminating
    # (a second DELETE may shorten their grace) or not the job's (a copy with its labels).
    spared: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodPatch:
    """Labels and annotations to merge into one pod (in-place restarts)."""

    namespace: str
    name: str
    uid: str  # only this pod, never a newer one of the same name
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
