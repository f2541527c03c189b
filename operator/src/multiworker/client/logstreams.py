"""Reading the workers' logs as one stream: once (every container's log, merged by the
kubelet's timestamps) or followed (a thread per container feeding one queue, and a watch on
the job's pods that opens a stream on each new pod or restarted container, so one follow spans
the group's restarts). Which lines belong where is loglines.py's; this is the wiring.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import watch

from multiworker.api import names
from multiworker.client import loglines
from multiworker.client.connection import REQUEST_TIMEOUT, Connection, raw, translated
from multiworker.client.errors import ApiError, ClientError, InvalidJob, JobNotFound
from multiworker.client.loglines import ContainerLog, Labeller, LogFilter, LogLine

_EARLIEST = datetime.min.replace(tzinfo=UTC)
POLL_SECONDS = 2.0  # how often a follow looks whether the job has finished
END_GRACE_SECONDS = 30.0  # after the job finished, how long streams still open may run
POD_WATCH_SECONDS = 60


def pod_selector(job: str, worker: int | None) -> str:
    labels = names.job_selector(job)
    if worker is not None:
        labels[names.LABEL_WORKER_INDEX] = str(worker)
    return names.label_selector(labels)


def list_pods(connection: Connection, job: str, worker: int | None) -> list[dict[str, Any]]:
    with translated(connection, f"list the pods of job {connection.namespace}/{job}"):
        found = raw(connection.core.list_namespaced_pod(
            connection.namespace, label_selector=pod_selector(job, worker),
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
    return sorted(found.get("items") or [], key=lambda p: p["metadata"]["name"])


def read_container(connection: Connection, run: ContainerLog) -> list[LogLine]:
    """One container run's lines, labelled; none when it has no log to read (a previous run
    the kubelet no longer keeps, a container not started yet, a pod gone meanwhile)."""
    try:
        with translated(connection, f"read the log of {run.pod}"):
            response: Any = connection.core.read_namespaced_pod_log(
                run.pod, connection.namespace, container=run.container, previous=run.previous,
                timestamps=True, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
    except (InvalidJob, JobNotFound):
        return []  # 400 or 404: nothing to read there (now)
    text = response.data.decode("utf-8", "replace")
    return loglines.label_log(text, run.worker, run.generation)


def read_logs(connection: Connection, job: str, selection: LogFilter) -> Iterator[LogLine]:
    """Every line asked for, oldest first across workers, then a note on what is gone.
    Each container's log is read whole before the merge: the kubelet keeps at most
    containerLogMaxSize x containerLogMaxFiles of it (10 MiB x 5 by default), and `worker=`
    reads one worker's alone."""
    pods = list_pods(connection, job, selection.worker)
    runs = [run for pod in pods
            for run in loglines.container_logs(pod, previous=selection.reads_previous)]
    merged = heapq.merge(*(read_container(connection, run) for run in runs),
                         key=lambda line: line.time or _EARLIEST)
    seen: set[int | None] = set()
    for line in merged:
        seen.add(line.generation)
        if selection.wants(line):
            yield line
    if selection.generation != "current":
        note = loglines.gone_note(selection.asked(), seen, len(pods))
        if note is not None:
            yield note


@dataclass(frozen=True)
class _Ended:
    key: tuple[str, int]


class Follower:
    """Follows every worker's trainer across restarts until the job has finished and its
    streams have ended. Threads: one watching the pods, one per container run streaming its
    log; all feed one queue that the iterating thread alone reads."""

    def __init__(self, connection: Connection, job: str, selection: LogFilter,
                 finished: Callable[[], bool]) -> None:
        self.connection, self.job, self.selection, self.finished = \
            connection, job, selection, finished
        self.queue: queue.Queue[LogLine | dict[str, Any] | _Ended | ClientError] = \
            queue.Queue()
        self.stop = threading.Event()
        self.opened: set[tuple[str, int]] = set()
        self.streaming: set[tuple[str, int]] = set()
        self.responses: list[Any] = []  # the open log streams, shut when the follow stops

    def lines(self) -> Iterator[LogLine]:
        threading.Thread(target=self._watch_pods, daemon=True, name="mwj-pods").start()
        ended_at: float | None = None
        next_check = time.monotonic()
        try:
            while True:
                try:
                    item = self.queue.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    item = None
                if isinstance(item, LogLine) and self.selection.wants(item):
                    yield item
                elif isinstance(item, dict):
                    self._open(item)
                elif isinstance(item, _Ended):
                    self.streaming.discard(item.key)
                elif isinstance(item, ClientError):
                    raise item
                if ended_at is None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + POLL_SECONDS
                    ended_at = time.monotonic() if self.finished() else None
                if ended_at is not None and (not self.streaming or
                                             time.monotonic() - ended_at > END_GRACE_SECONDS):
                    return
        finally:
            self.stop.set()
            for response in list(self.responses):
                with contextlib.suppress(Exception):
                    response.shutdown()  # unblocks its thread's read

    def _open(self, pod: dict[str, Any]) -> None:
        """Stream the trainer's current run in `pod` if it has not been yet (a new pod, or a
        container the kubelet restarted), with its previous run first when asked for."""
        container = loglines.trainer_container(pod)
        if container is None or not loglines.has_started(pod, container):
            return
        runs = loglines.container_logs(pod, previous=self.selection.reads_previous)
        current = runs[-1]
        key = (current.uid, current.restarts)
        if key in self.opened:
            return
        first = not any(uid == current.uid for uid, _ in self.opened)
        self.opened.add(key)
        self.streaming.add(key)
        earlier = runs[:-1] if first else []  # a restart seen live was streamed already
        threading.Thread(target=self._stream, args=(key, earlier, current), daemon=True,
                         name=f"mwj-log-{current.pod}").start()

    def _stream(self, key: tuple[str, int], earlier: list[ContainerLog],
                run: ContainerLog) -> None:
        try:
            for previous in earlier:
                for line in read_container(self.connection, previous):
                    self.queue.put(line)
            with translated(self.connection, f"follow the log of {run.pod}"):
                response: Any = self.connection.core.read_namespaced_pod_log(
                    run.pod, self.connection.namespace, container=run.container, follow=True,
                    timestamps=True, _preload_content=False)
            labeller = Labeller(run.worker, run.generation, hold=run.launcher)
            self.responses.append(response)
            try:
                for chunk in response:
                    if self.stop.is_set():
                        break
                    for line in labeller.label(chunk.decode("utf-8", "replace")):
                        self.queue.put(line)
                for line in labeller.flush():
                    self.queue.put(line)
            finally:
                self.responses.remove(response)
                response.release_conn()
        except (InvalidJob, JobNotFound):
            pass  # the container went before its log could be read
        except ClientError as e:
            self.queue.put(e)
        except (urllib3.exceptions.HTTPError, OSError, ValueError):
            pass  # the stream was cut (or shut by stop): a new run is opened anew when seen
        finally:
            self.queue.put(_Ended(key))

    def _watch_pods(self) -> None:
        """Put every change of the job's pods on the queue until the follow stops."""
        selector = pod_selector(self.job, self.selection.worker)
        core, namespace = self.connection.core, self.connection.namespace
        try:
            while not self.stop.is_set():
                with translated(self.connection, f"list the pods of job {namespace}/{self.job}"):
                    listed = raw(core.list_namespaced_pod(
                        namespace, label_selector=selector, _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT))
                for pod in listed.get("items") or []:
                    self.queue.put(pod)
                try:
                    with translated(self.connection, f"watch the pods of job {self.job}"):
                        for event in watch.Watch().stream(
                                core.list_namespaced_pod, namespace, label_selector=selector,
                                resource_version=listed["metadata"]["resourceVersion"],
                                timeout_seconds=POD_WATCH_SECONDS, deserialize=False,
                                _request_timeout=(REQUEST_TIMEOUT[0],
                                                  POD_WATCH_SECONDS + REQUEST_TIMEOUT[0])):
                            if self.stop.is_set():
                                return
                            if event["type"] in ("ADDED", "MODIFIED"):
                                self.queue.put(event["object"])
                except ApiError as e:
                    if e.status != 410:
                        raise
        except ClientError as e:
            self.queue.put(e)
