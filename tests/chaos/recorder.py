"""A watch of the test's own over the pods and jobs of one namespace, recording every event the
API server sends — independent of the operator's caches — for the invariants (invariants.py).

The watch resumes from the last resourceVersion it saw. When it cannot (the API server was
restarted and answers `410 Gone`), it lists again and records what changed meanwhile as events
marked `gap`: they all carry the list's resourceVersion, because their order inside the gap is
unknown. The gaps themselves (when, how long) are kept for the case's figures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from tests.chaos.rest import Expired, Rest, jobs_path, pods_path

log = logging.getLogger(__name__)

LABEL_INDEX = "multiworker.dev/worker-index"
LABEL_GENERATION = "multiworker.dev/group-generation"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    """One pod or job event, reduced to what the invariants read."""

    kind: str  # ADDED, MODIFIED, DELETED
    rv: int  # resourceVersion (one etcd: comparable across resources)
    at: float  # time.monotonic() when the test saw it
    uid: str
    name: str
    deleting: bool  # metadata.deletionTimestamp is set
    owner: str = ""  # uid of the controlling ownerReference
    owner_kind: str = ""
    index: int | None = None  # worker index label (pods)
    generation: int | None = None  # group generation label (pods)
    phase: str = ""  # pod phase, or job status.phase
    status: Obj = field(default_factory=dict)  # a job's status
    gap: bool = False  # synthesized from a re-list; order within the gap unknown


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def to_event(kind: str, obj: Obj, at: float, gap_rv: int | None = None) -> Event:
    """`gap_rv`: the event was synthesized from a list at that resourceVersion."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    controller: Obj = next((o for o in meta.get("ownerReferences") or []
                            if o.get("controller")), {})
    status = obj.get("status") or {}
    return Event(
        kind=kind, rv=gap_rv or _int(meta.get("resourceVersion")) or 0, at=at,
        uid=meta.get("uid", ""),
        name=meta.get("name", ""), deleting=bool(meta.get("deletionTimestamp")),
        owner=controller.get("uid", ""), owner_kind=controller.get("kind", ""),
        index=_int(labels.get(LABEL_INDEX)), generation=_int(labels.get(LABEL_GENERATION)),
        phase=status.get("phase") or "", status=status if obj.get("kind") != "Pod" else {},
        gap=gap_rv is not None,
    )


@dataclass
class Follower:
    """List once, then watch; resume after errors; re-list (recording a gap) after 410."""

    rest: Rest
    path: str  # collection path, e.g. /api/v1/namespaces/NS/pods
    sink: Callable[[Event], None]
    on_gap: Callable[[float, float], None]
    stopping: threading.Event
    synced: threading.Event = field(default_factory=threading.Event)
    known: dict[str, Event] = field(default_factory=dict)  # by uid
    errors: int = 0

    def run(self) -> None:
        version: str | None = None
        lost_at: float | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    version = self._relist(gap=lost_at)
                    lost_at = None
                    self.synced.set()
                version = self._watch(version)
                lost_at = None  # the server ended the watch: nothing was missed
            except Expired:
                lost_at = lost_at or time.monotonic()
                version = None
            except Exception as e:  # noqa: BLE001 (the API server is down or restarting)
                self.errors += 1
                log.debug("watch of %s failed: %s", self.path, e)
                lost_at = lost_at or time.monotonic()
                self.stopping.wait(0.2)

    def _relist(self, gap: float | None) -> str:
        body = self.rest.call("GET", self.path)
        now = time.monotonic()
        fresh = {o["metadata"]["uid"]: o for o in body.get("items", [])}
        listed = _int(body["metadata"].get("resourceVersion")) or 0
        gap_rv = None if gap is None and not self.synced.is_set() else listed
        for uid in [u for u in self.known if u not in fresh]:
            old = self.known.pop(uid)
            self.sink(replace(old, kind="DELETED", rv=listed, at=now, gap=True))
        for uid, obj in fresh.items():
            obj.setdefault("kind", body.get("kind", "").removesuffix("List"))
            seen = self.known.get(uid)
            if seen is not None and seen.rv >= (_int(obj["metadata"].get("resourceVersion"))
                                                or 0):
                continue  # unchanged since the watch showed it
            event = to_event("ADDED" if seen is None else "MODIFIED", obj, now, gap_rv)
            self.known[uid] = event
            self.sink(event)
        if gap is not None:
            self.on_gap(gap, now)
        return str(body["metadata"].get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        for raw in self.rest.watch(self.path, version):
            if self.stopping.is_set():
                break
            kind, obj = raw.get("type", ""), raw.get("object") or {}
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            event = to_event(kind, obj, time.monotonic())
            if kind == "DELETED":
                self.known.pop(event.uid, None)
            else:
                self.known[event.uid] = event
            self.sink(event)
        return version


class Recorder:
    """Every pod and job event of one namespace, in the order the API server sent them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.pods: list[Event] = []
        self.jobs: list[Event] = []
        self.gaps: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        rest = Rest(api)
        self._followers = [
            Follower(rest, pods_path(namespace), self._sink(self.pods), self._gap,
                     self._stopping),
            Follower(rest, jobs_path(namespace), self._sink(self.jobs), self._gap,
                     self._stopping),
        ]
        self._threads = [threading.Thread(target=f.run, name=f"recorder {f.path}", daemon=True)
                         for f in self._followers]

    def _sink(self, into: list[Event]) -> Callable[[Event], None]:
        def add(event: Event) -> None:
            with self._lock:
                into.append(event)
        return add

    def _gap(self, start: float, end: float) -> None:
        with self._lock:
            self.gaps.append((start, end))

    def start(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        for follower in self._followers:
            if not follower.synced.wait(60):
                raise AssertionError(f"the recorder's first list of {follower.path} failed")
        return self

    def stop(self) -> None:
        self._stopping.set()

    def snapshot(self) -> tuple[list[Event], list[Event]]:
        """(pod events, job events) so far."""
        with self._lock:
            return list(self.pods), list(self.jobs)

    def live_pods(self) -> dict[str, Event]:
        """The latest event of every pod that exists now (as far as the watch has told)."""
        return dict(self._followers[0].known)

    def live_jobs(self) -> dict[str, Event]:
        return dict(self._followers[1].known)
