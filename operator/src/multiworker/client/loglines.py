"""Which worker and which generation each log line belongs to, and which lines a reader asked
for. Pure: pods and log text in, labelled lines out (`logstreams.py` reads them).

A worker's lines of several generations can sit in one container's log:

* With warm standby (restartPolicy.mode InPlace), the launcher runs every generation in one
  container and writes a header before each (pod/launcher.py):
  `==== multiworker: generation N of worker W, warm start (...) at TIME ====`.
  The lines after a header are generation N's.
* A cold in-place restart is the kubelet restarting the container: the one before it is read
  as the `previous` log. Its generation is the one its exit was recorded for (the
  trainer-exit annotation), else the one before the pod's released generation.
* A Recreate restart deletes the pods: earlier generations' logs are gone from the cluster;
  `gone_note` says so rather than leave a reader guessing.

Lines before a container's first header belong to that header's generation (the launcher's
own start-up lines), or, where there is none, to the generation the pod's annotations and
labels say the container run started with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from multiworker.api import names

Selection = Literal["current", "all"] | int
HEADER = re.compile(r"^==== multiworker: generation (?P<generation>\d+) of worker "
                    r"(?P<worker>\S+), (?P<start>.+) at (?P<at>\S+) ====$")
LAUNCHER_PREFIX = "multiworker launcher: "  # the warm launcher's own lines (pod/children.py)
# The kubelet's timestamp before each line (timestamps=true): RFC 3339 with up to nanoseconds.
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d) ")
_NOT_TRAINERS = frozenset({names.AGENT_CONTAINER, names.GATE_CONTAINER})
# Lines held back while a launcher's first header is awaited: its start-up says little more.
HOLD_LIMIT = 200


@dataclass(frozen=True)
class LogLine:
    """One line of a worker's log, labelled; `worker` None: a note about the logs themselves."""

    worker: int | None
    generation: int | None
    text: str
    time: datetime | None = None
    """When the kubelet read it from the container."""

    def __str__(self) -> str:
        if self.worker is None:
            return f"[note] {self.text}"
        generation = "?" if self.generation is None else self.generation
        return f"[worker-{self.worker} gen {generation}] {self.text}"


@dataclass(frozen=True)
class Header:
    """The warm launcher's line before each generation's trainer."""

    generation: int
    worker: str
    start: str
    """`warm start (spare ready for 3.2s)` or `cold start (why)`."""


def parse_header(text: str) -> Header | None:
    found = HEADER.match(text.rstrip("\r"))
    if found is None:
        return None
    return Header(int(found["generation"]), found["worker"], found["start"])


def split_timestamp(line: str) -> tuple[datetime | None, str]:
    """The kubelet's timestamp of `line` (at microseconds) and the text after it."""
    found = _TIMESTAMP.match(line)
    if found is None:
        return None, line
    fraction = (found[2] or ".0")[:7].ljust(7, "0")
    zone = "+00:00" if found[3] == "Z" else found[3]
    return datetime.fromisoformat(f"{found[1]}{fraction}{zone}"), line[found.end():]


class Labeller:
    """Labels one container run's lines in order: each header starts its generation. With
    `hold` (a header is expected: the warm launcher's container, or a whole log read at once)
    the lines before the first header wait for it, since the generation the run started with
    is the header's: the pod's annotations have moved on with its later generations."""

    def __init__(self, worker: int | None, generation: int | None, hold: bool = False) -> None:
        self.worker, self.generation = worker, generation
        self.held: list[tuple[datetime | None, str]] | None = [] if hold else None

    def label(self, line: str) -> list[LogLine]:
        """`line` labelled, after any lines it released; none while they are held."""
        time, text = split_timestamp(line.rstrip("\n"))
        header = parse_header(text)
        if header is not None:
            self.generation = header.generation
        if self.held is not None and header is None and len(self.held) < HOLD_LIMIT:
            self.held.append((time, text))
            return []
        return [*self.flush(), LogLine(self.worker, self.generation, text, time)]

    def flush(self) -> list[LogLine]:
        """The lines held, labelled as things stand (at the end of the log: no header came)."""
        held, self.held = self.held or [], None
        return [LogLine(self.worker, self.generation, text, time) for time, text in held]


def label_log(text: str, worker: int | None, generation: int | None) -> list[LogLine]:
    """A whole log's lines, labelled."""
    labeller = Labeller(worker, generation, hold=True)
    lines = [labelled for line in text.splitlines() for labelled in labeller.label(line)]
    return lines + labeller.flush()


@dataclass(frozen=True)
class ContainerLog:
    """One container run of a worker pod whose log can be read."""

    pod: str
    uid: str
    worker: int | None
    container: str
    previous: bool
    """The run before the kubelet's last restart of the container (read with previous=true)."""
    generation: int | None
    """The generation of its lines before any header."""
    restarts: int
    """The container's restartCount when seen: a new count is a new run to follow."""
    launcher: bool = False
    """The warm launcher runs its trainers: a header precedes each generation's lines."""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def trainer_container(pod: Mapping[str, Any]) -> str | None:
    """The training container: named in the pod's annotation, else the first that is not the
    operator's (its in-place agent and gate)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    named = (meta.get("annotations") or {}).get(names.ANNOTATION_TRAINER)
    if named:
        return str(named)
    return next((str(c["name"]) for c in spec.get("containers", [])
                 if c.get("name") not in _NOT_TRAINERS), None)


def _container_status(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == container), {})


def restart_count(pod: Mapping[str, Any], container: str) -> int:
    return _int(_container_status(pod, container).get("restartCount")) or 0


def has_started(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the container's current run has a log to read (it ran, or runs)."""
    state = _container_status(pod, container).get("state") or {}
    return "running" in state or "terminated" in state


def runs_launcher(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's trainers run in the warm launcher (the operator names the port of
    the agent that reports on it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return names.ANNOTATION_WARM_AGENT_PORT in annotations


def current_generation(pod: Mapping[str, Any]) -> int | None:
    """The generation the pod's current container run started with: the one released to it
    (in place), else its label."""
    meta = pod.get("metadata") or {}
    released = _int((meta.get("annotations") or {}).get(names.ANNOTATION_RELEASED))
    label = _int((meta.get("labels") or {}).get(names.LABEL_GROUP_GENERATION))
    return released if released is not None else label


def previous_generation(pod: Mapping[str, Any]) -> int | None:
    """The generation of the container run before the kubelet's last restart: the one its
    exit was recorded for, else the one before the current run's."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        recorded = _int(json.loads(annotations.get(names.ANNOTATION_TRAINER_EXIT) or "{}")
                        .get("generation"))
    except (ValueError, AttributeError):
        recorded = None
    if recorded is not None:
        return recorded
    current = current_generation(pod)
    return None if current is None else max(current - 1, 0)


def container_logs(pod: Mapping[str, Any], previous: bool) -> list[ContainerLog]:
    """The trainer's runs in `pod` to read, in order: the previous one (when asked for and
    the container was restarted), then the current one."""
    container = trainer_container(pod)
    if container is None:
        return []
    meta = pod.get("metadata") or {}
    worker = _int((meta.get("labels") or {}).get(names.LABEL_WORKER_INDEX))
    restarts = restart_count(pod, container)
    pod_name, uid, launcher = str(meta.get("name")), str(meta.get("uid", "")), runs_launcher(pod)
    runs = []
    if previous and restarts > 0:
        runs.append(ContainerLog(pod_name, uid, worker, container, True,
                                 previous_generation(pod), restarts, launcher))
    runs.append(ContainerLog(pod_name, uid, worker, container, False, current_generation(pod),
                             restarts, launcher))
    return runs


@dataclass(frozen=True)
class LogFilter:
    """Which lines a reader asked for."""

    worker: int | None
    generation: Selection
    current: int
    """The job's group generation when the logs were asked for."""
    follow: bool = False

    @property
    def reads_previous(self) -> bool:
        """Whether a restarted container's previous run may hold lines asked for: only
        earlier generations' are there."""
        return self.generation != "current"

    def wants(self, line: LogLine) -> bool:
        """Notes and lines of an unknown generation are always shown; following, `current`
        means this generation and those after it."""
        if line.worker is None:
            return True
        if self.worker is not None and line.worker != self.worker:
            return False
        if line.generation is None or self.generation == "all":
            return True
        if self.generation == "current":
            return line.generation >= self.current if self.follow \
                else line.generation == self.current
        return line.generation == self.generation

    def asked(self) -> set[int]:
        """The generations asked for by number (`all`: every one so far)."""
        if self.generation == "all":
            return set(range(self.current + 1))
        return {self.current if self.generation == "current" else self.generation}


def gone_note(asked: set[int], seen: Iterable[int | None], pods: int) -> LogLine | None:
    """A note naming the generations asked for whose lines the cluster no longer has."""
    missing = sorted(asked - {g for g in seen if g is not None})
    if not missing:
        return None
    if not pods:
        return LogLine(None, None, "no worker pods are left: their logs went with them "
                                   "(spec.cleanPodPolicy All deletes every pod at the end)")
    listed = ", ".join(str(g) for g in missing)
    plural = "s" if len(missing) > 1 else ""
    return LogLine(None, None, f"no log lines of generation{plural} {listed} are left in the "
                               "cluster: a group restarted by recreating its pods takes their "
                               "logs with it (restartPolicy.mode InPlace keeps them)")
