"""One MultiWorkerJob as a notebook or script uses it: its status, waiting for it, following
its progress, its Events, history and logs. Reads only: the job is changed through `Client`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Iterator
from typing import Any, TextIO

from multiworker.api import names
from multiworker.api.status import (
    TERMINAL_PHASES,
    GenerationRecord,
    JobStatus,
    UnreadableStatus,
    parse_status,
)
from multiworker.client import logstreams
from multiworker.client.connection import REQUEST_TIMEOUT, Connection, as_dict, raw, translated
from multiworker.client.display import display
from multiworker.client.errors import ClientError, JobNotFound, WaitTimeout
from multiworker.client.events import Event, event_selector, events_of
from multiworker.client.loglines import LogFilter, LogLine, Selection
from multiworker.client.progress import (
    Outcome,
    ProgressUpdate,
    failure,
    phases,
    update_of,
    wait_outcome,
)
from multiworker.client.watching import watch_job


def status_of(name: str, body: dict[str, Any]) -> JobStatus:
    """The job's status as the API's model reads it; ClientError when it cannot be read."""
    try:
        return parse_status(body.get("status"))
    except UnreadableStatus as e:
        raise ClientError(f"the status of job {name} cannot be read: {e}") from e


class Job:
    """A MultiWorkerJob in the cluster, as last read (`manifest`); `status()` reads it anew."""

    def __init__(self, connection: Connection, manifest: dict[str, Any]) -> None:
        self._connection = connection
        self.manifest = manifest
        """The job as last read from the API server: metadata, spec and status."""

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"].get("namespace") or self._connection.namespace)

    def __repr__(self) -> str:
        return f"Job({self.namespace}/{self.name})"

    def refresh(self) -> Job:
        """Read the job again (JobNotFound once it is deleted)."""
        with translated(self._connection, f"read job {self.namespace}/{self.name}",
                        not_found=self._missing):
            self.manifest = as_dict(self._connection.custom.get_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, self.name,
                _request_timeout=REQUEST_TIMEOUT))
        return self

    def status(self) -> JobStatus:
        """The job's status now (read afresh)."""
        return status_of(self.name, self.refresh().manifest)

    def history(self) -> list[GenerationRecord]:
        """The group's generations, oldest first (status.history): when each started, ran and
        ended, why, and the steps its end cost."""
        return list(self.status().history or [])

    def events(self) -> list[Event]:
        """The job's Events, oldest first (the API server keeps them about an hour)."""
        with translated(self._connection, f"list the Events of job {self.name}"):
            found = raw(self._connection.core.list_namespaced_event(
                self.namespace, field_selector=event_selector(self.name),
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
        return events_of(found.get("items") or [])

    def wait(self, until: Collection[str] = ("Succeeded",),
             timeout: float | None = None) -> JobStatus:
        """Wait until the job's phase is one of `until` and return its status. JobFailed when
        it Fails instead (unless Failed is in `until`); a job that Succeeded returns at once
        whatever `until` says, since it will not change again. WaitTimeout after `timeout`
        seconds; JobNotFound if it is deleted."""
        wanted = phases(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        for body in watch_job(self._connection, self.name, deadline):
            self.manifest = body
            status = status_of(self.name, body)
            outcome = wait_outcome(status, wanted)
            if outcome is Outcome.FAILED:
                raise failure(self.name, status)
            if outcome is not None:
                return status
        said = " or ".join(sorted(wanted))
        raise WaitTimeout(f"job {self.namespace}/{self.name} was not {said} after {timeout:g}s "
                          f"(phase {self.manifest.get('status', {}).get('phase', 'unknown')})")

    def progress(self, timeout: float | None = None) -> Iterator[ProgressUpdate]:
        """An update each time the job's phase, generation, readiness or training progress
        changes, ending after the one where it finished (Succeeded or Failed). WaitTimeout
        when it has not finished after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: ProgressUpdate | None = None
        for body in watch_job(self._connection, self.name, deadline):
            self.manifest = body
            update = update_of(status_of(self.name, body))
            if update != last:
                yield update
                last = update
            if update.finished:
                return
        raise WaitTimeout(f"job {self.namespace}/{self.name} had not finished after "
                          f"{timeout:g}s")

    def follow(self, progress_bar: bool = True, timeout: float | None = None,
               out: TextIO | None = None) -> JobStatus:
        """Show the job's progress until it finishes (a tqdm bar where tqdm is installed,
        else a line per change) and return its final status, Failed included."""
        shown = display(progress_bar, out or sys.stdout)
        try:
            for update in self.progress(timeout):
                shown.show(update)
        finally:
            shown.close()
        return status_of(self.name, self.manifest)

    def logs(self, worker: int | None = None, generation: Selection = "current",
             follow: bool = False) -> Iterator[LogLine]:
        """The workers' log lines as one stream, each labelled with its worker and generation
        (`str(line)`: `[worker-1 gen 2] text`). `worker`: one worker's only. `generation`:
        `current`, `all`, or a number; what the cluster no longer has (pods a Recreate
        restart deleted) is said in a note (worker None) instead. `follow`: keep streaming,
        across restarts, until the job has finished."""
        selection = LogFilter(worker, generation, self.status().group_generation, follow)
        if not follow:
            return logstreams.read_logs(self._connection, self.name, selection)
        return logstreams.Follower(self._connection, self.name, selection,
                                   self._finished).lines()

    def _finished(self) -> bool:
        try:
            return self.status().phase in TERMINAL_PHASES
        except JobNotFound:
            return True

    def _missing(self) -> JobNotFound:
        return JobNotFound(f"job {self.namespace}/{self.name} not found")
