"""What the benchmark sees of one namespace: its pods and jobs, kept current by watches.

Why watches and not polling: at 8,000 pods a LIST every poll costs the API server far more than
the operators under test, and a watch tells *when* each change arrived (time.monotonic()), so a
wait resolves to the moment the last needed event was seen, not the next poll. The harness's own
load is the same for both operators (one LIST and one WATCH per kind), and it is not counted as
theirs (see identity.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

from tests.bench.harness import Cluster, Obj


@dataclass(frozen=True)
class Pod:
    uid: str
    name: str
    owner: str  # uid of the owning job ("" when none)
    running: bool  # phase Running and not being deleted
    failed: bool  # phase Failed


def pod_view(raw: Obj) -> Pod:
    meta, status = raw["metadata"], raw.get("status") or {}
    owners = meta.get("ownerReferences") or []
    phase = status.get("phase")
    return Pod(uid=meta["uid"], name=meta["name"], owner=owners[0]["uid"] if owners else "",
               running=phase == "Running" and "deletionTimestamp" not in meta,
               failed=phase == "Failed")


@dataclass
class State:
    """The namespace as last seen: pods by uid, jobs by name, and every pod ADDED/DELETED."""

    pods: dict[str, Pod] = field(default_factory=dict)
    jobs: dict[str, Obj] = field(default_factory=dict)
    history: list[tuple[float, str, Pod]] = field(default_factory=list)  # (seen, ADDED|DELETED)
    seen: float = 0.0  # when the latest event was applied

    def job_pods(self, job: str) -> list[Pod]:
        uid = self.jobs.get(job, {}).get("metadata", {}).get("uid")
        return [p for p in self.pods.values() if uid and p.owner == uid]

    def pods_by_job(self) -> dict[str, list[Pod]]:
        by_uid: dict[str, list[Pod]] = {}
        for p in self.pods.values():
            by_uid.setdefault(p.owner, []).append(p)
        return {name: by_uid.get(job["metadata"]["uid"], []) for name, job in self.jobs.items()}


class Mirror:
    """Pods and one kind of job in `namespace`, each fed by LIST then WATCH (re-listed on
    410 Gone or any break), on daemon threads until close()."""

    def __init__(self, cluster: Cluster, namespace: str, job_api: tuple[str, str, str]) -> None:
        self.cluster, self.namespace, (self.group, self.version, self.plural) = (
            cluster, namespace, job_api)
        self.state = State()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._responses: list[Any] = []
        self._synced = {"pods": threading.Event(), "jobs": threading.Event()}
        for kind in self._synced:
            threading.Thread(target=self._follow, args=(kind,), daemon=True,
                             name=f"mirror-{kind}").start()
        for kind, synced in self._synced.items():
            if not synced.wait(60):
                raise RuntimeError(f"mirror: no initial list of {kind} in {namespace}")

    def close(self) -> None:
        """Stop both threads. Their watches are ended by shutting the socket down: closing the
        response from here would wait for the lock its reader holds while blocked."""
        self._stop.set()
        for response in list(self._responses):
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _call(self, kind: str, **kw: Any) -> Any:
        if kind == "pods":
            return self.cluster.core.list_namespaced_pod(self.namespace, _preload_content=False,
                                                         **kw)
        return self.cluster.custom.list_namespaced_custom_object(
            self.group, self.version, self.namespace, self.plural, _preload_content=False, **kw)

    def _follow(self, kind: str) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(self._call(kind).data)
                self._replace(kind, listed["items"])
                self._synced[kind].set()
                self._watch(kind, listed["metadata"]["resourceVersion"])
            except Exception:  # noqa: BLE001 - any break: list again, unless closing
                if not self._stop.is_set():
                    time.sleep(0.5)

    def _watch(self, kind: str, version: str) -> None:
        while not self._stop.is_set():
            response = self._call(kind, watch=True, resource_version=version,
                                  timeout_seconds=1800)  # no re-watch inside a window
            self._responses.append(response)
            try:
                for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        return  # 410 Gone (or worse): list again
                    version = obj["metadata"]["resourceVersion"]
                    self._apply(kind, event["type"], obj)
            finally:
                self._responses.remove(response)
                with contextlib.suppress(Exception):
                    response.release_conn()

    def _replace(self, kind: str, items: list[Obj]) -> None:
        with self._changed:
            now = time.monotonic()
            if kind == "pods":
                self.state.pods = {p.uid: p for p in map(pod_view, items)}
            else:
                self.state.jobs = {j["metadata"]["name"]: j for j in items}
            self.state.seen = now
            self._changed.notify_all()

    def _apply(self, kind: str, kind_of_event: str, obj: Obj) -> None:
        with self._changed:
            now = time.monotonic()
            if kind == "pods":
                pod = pod_view(obj)
                if kind_of_event == "DELETED":
                    self.state.pods.pop(pod.uid, None)
                else:
                    if pod.uid not in self.state.pods:
                        self.state.history.append((now, "ADDED", pod))
                    self.state.pods[pod.uid] = pod
                if kind_of_event == "DELETED":
                    self.state.history.append((now, "DELETED", pod))
            elif kind_of_event == "DELETED":
                self.state.jobs.pop(obj["metadata"]["name"], None)
            elif kind_of_event != "BOOKMARK":
                self.state.jobs[obj["metadata"]["name"]] = obj
            self.state.seen = now
            self._changed.notify_all()

    @contextlib.contextmanager
    def locked(self) -> Iterator[State]:
        with self._changed:
            yield self.state

    def wait(self, done: Callable[[State], bool], timeout: float, what: str,
             every: float = 0.02) -> float:
        """When (time.monotonic()) the event that made `done` true arrived. `done` is checked
        after changes, at most once per `every` seconds (it may walk every pod)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                if done(self.state):
                    return self.state.seen
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
                self._changed.wait(left)
            time.sleep(every)
