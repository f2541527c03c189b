"""Following one job as it changes: a list, then a watch from the list's resourceVersion, then
a list again whenever the watch ends (its server-side timeout, or 410 Gone when the version
has expired). Whoever iterates sees the job's whole body each time it changes, and at least
once a minute (each re-list), so a missed event is caught up within that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import watch

from multiworker.api import names
from multiworker.client.connection import REQUEST_TIMEOUT, Connection, as_dict, translated
from multiworker.client.errors import ApiError, JobNotFound

WATCH_SECONDS = 60  # one watch's server-side length; then the job is listed again
GONE = 410


def watch_job(connection: Connection, name: str,
              deadline: float | None = None) -> Iterator[dict[str, Any]]:
    """The job's body now, then each time it changes, until time.monotonic() passes
    `deadline` (the iteration then just ends). JobNotFound when it is not there, or deleted."""
    namespace = connection.namespace
    selector = f"metadata.name={name}"
    missing = JobNotFound(f"job {namespace}/{name} not found")
    while True:
        with translated(connection, f"read job {namespace}/{name}"):
            listed = as_dict(connection.custom.list_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, field_selector=selector,
                _request_timeout=REQUEST_TIMEOUT))
        items = listed.get("items") or []
        if not items:
            raise missing
        yield items[0]
        seconds = WATCH_SECONDS if deadline is None else \
            min(WATCH_SECONDS, math.ceil(deadline - time.monotonic()))
        if seconds <= 0:
            return
        try:
            yield from _changes(connection, name, selector, listed["metadata"]["resourceVersion"],
                                seconds)
        except ApiError as e:
            if e.status != GONE:
                raise  # 410: the version expired; list again


def _changes(connection: Connection, name: str, selector: str, version: str,
             seconds: int) -> Iterator[dict[str, Any]]:
    """Each new body of the job for up to `seconds` from `version`."""
    namespace = connection.namespace
    stream = watch.Watch().stream(
        connection.custom.list_namespaced_custom_object, names.GROUP, names.VERSION, namespace,
        names.PLURAL, field_selector=selector, resource_version=version,
        timeout_seconds=seconds, allow_watch_bookmarks=True,
        # The server ends the watch after `seconds`; a connection that goes silent longer
        # than that is dead.
        _request_timeout=(REQUEST_TIMEOUT[0], seconds + REQUEST_TIMEOUT[0]))
    with translated(connection, f"watch job {namespace}/{name}"):
        for event in stream:
            if event["type"] == "DELETED":
                raise JobNotFound(f"job {namespace}/{name} was deleted")
            if event["type"] in ("ADDED", "MODIFIED"):
                yield event["raw_object"]
