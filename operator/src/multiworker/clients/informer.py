"""Watch-fed caches: each Informer lists its objects once, then follows a watch, so reconcile
passes read from memory instead of the API server.

Why our own and not kopf's watches: kopf 1.45 can select server-side, but when a watch
expires (`410 Gone`) it lists again without telling handlers which objects disappeared
meanwhile, so a cache fed by its events could keep a deleted pod forever. Here a re-list
*replaces* the store and reports what vanished as deletions (client-go's Reflector does the
same). Each informer runs in one thread of its own: the kubernetes client is synchronous.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from multiworker.clients.kube import Cluster
from multiworker.clients.shapes import OBJECT, Shape
from multiworker.clients.transport import Expired

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
# (event type, old object or None, new object or None), called in the informer's thread.
Listener = Callable[[str, Manifest | None, Manifest | None], None]

LIST_PAGE = 500
SERVER_TIMEOUT_SECONDS = 300  # the server ends each watch after this; we resume from its RV
_RETRY_SECONDS = (0.2, 0.5, 1, 2, 5, 10, 30)


def key_of(obj: Manifest) -> Key:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


@dataclass
class Store:
    """Objects of one resource as last seen, by key, with an optional secondary index
    (e.g. pods by job). Thread-safe: informers write, passes read."""

    index_of: Callable[[Manifest], Key | None] | None = None
    _objects: dict[Key, Manifest] = field(default_factory=dict)
    _index: dict[Key, dict[Key, Manifest]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: Key) -> Manifest | None:
        with self._lock:
            return self._objects.get(key)

    def by_index(self, index: Key) -> list[Manifest]:
        with self._lock:
            return list(self._index.get(index, {}).values())

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._objects)

    def indexes(self) -> list[Key]:
        """The secondary index's keys (e.g. every node some pod is on)."""
        with self._lock:
            return list(self._index)

    def __len__(self) -> int:
        return len(self._objects)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    def put(self, obj: Manifest) -> Manifest | None:
        """Insert or update; the previous version."""
        key = key_of(obj)
        with self._lock:
            old = self._objects.get(key)
            self._objects[key] = obj
            self._unindex(key, old)
            self._add_index(key, obj)
            return old

    def remove(self, key: Key) -> Manifest | None:
        with self._lock:
            old = self._objects.pop(key, None)
            self._unindex(key, old)
            return old

    def replace(self, objects: Iterable[Manifest], scope: Callable[[Key], bool]
                ) -> list[tuple[str, Manifest | None, Manifest | None]]:
        """Make the store hold exactly `objects` within `scope` (one informer's namespace);
        the changes as events, deletions included."""
        fresh = {key_of(o): o for o in objects}
        changes: list[tuple[str, Manifest | None, Manifest | None]] = []
        for key in [k for k in self.keys() if scope(k) and k not in fresh]:
            changes.append(("DELETED", self.remove(key), None))
        for obj in fresh.values():
            old = self.put(obj)
            if old is None or _version(old) != _version(obj):
                changes.append(("ADDED" if old is None else "MODIFIED", old, obj))
        return changes

    def _add_index(self, key: Key, obj: Manifest) -> None:
        index = self.index_of(obj) if self.index_of else None
        if index is not None:
            self._index.setdefault(index, {})[key] = obj

    def _unindex(self, key: Key, old: Manifest | None) -> None:
        index = self.index_of(old) if self.index_of and old is not None else None
        if index is not None and index in self._index:
            self._index[index].pop(key, None)
            if not self._index[index]:
                del self._index[index]


def _version(obj: Manifest | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion", ""))


@dataclass
class Informer:
    """List, then watch, one resource in one namespace (or cluster-wide) into a Store."""

    cluster: Cluster
    path: str  # collection path, e.g. /api/v1/namespaces/ns/pods or /api/v1/pods
    store: Store
    listener: Listener
    namespace: str | None = None  # None: cluster-wide (the store may hold other namespaces)
    selector: str | None = None  # server-side label selector
    shape: Shape = OBJECT  # what the store keeps of each object (shapes.py)
    synced: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    relists: int = 0  # how often it had to list (start-up, then every 410 Gone)
    # Told False when the watch fails, True once it delivers again (a list, or any event):
    # what was not heard meanwhile did not happen unheard (heartbeats.py).
    on_state: Callable[[bool], None] | None = None
    _down: bool = False
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer {self.path}",
                                        daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        version: str | None = None
        failures = 0
        while not self.stopping.is_set():
            try:
                if version is None:
                    version = self._relist()
                    self.synced.set()
                version = self._follow(version)
                failures = 0
            except Expired:
                log.info("watch of %s expired (410 Gone): listing again", self.path)
                version = None
            except Exception as e:  # API down, connection reset: resume where we were
                delay = _RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)]
                failures += 1
                self._state(False)
                log.warning("watch of %s failed (%s); retrying in %gs", self.path, e, delay)
                self.stopping.wait(delay)

    def _relist(self) -> str:
        items: list[Manifest] = []
        cont: str | None = None
        while True:
            page = self.cluster.list_page(self.path, self.selector, LIST_PAGE, cont)
            # An object the store holds at the same version is kept as it is: a relist then
            # holds one copy of the cache, not two, until the store is replaced.
            for item in page.get("items", []):
                held = self.store.get(key_of(item))
                same = held is not None and _version(held) == _version(item)
                items.append(held if same and held is not None else self.shape.slim(item))
            cont = (page.get("metadata") or {}).get("continue") or None
            if cont is None:
                break
        self.relists += 1
        self._state(True)
        for change in self.store.replace(items, self._in_scope):
            self.listener(*change)
        return str(page.get("metadata", {}).get("resourceVersion", ""))

    def _follow(self, version: str) -> str:
        for event in self.cluster.watch(self.path, self.selector, version,
                                        SERVER_TIMEOUT_SECONDS, self.shape.decode):
            if self.stopping.is_set():
                break
            self._state(True)
            kind, obj = event.get("type", ""), event.get("object") or {}
            version = _version(obj) or version
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                old = self.store.remove(key_of(obj))
                self.listener(kind, old, None)
            elif kind in ("ADDED", "MODIFIED"):
                old = self.store.put(obj)
                self.listener(kind, old, obj)
        return version

    def _state(self, up: bool) -> None:
        if self.on_state is not None and self._down == up:
            self._down = not up
            self.on_state(up)

    def _in_scope(self, key: Key) -> bool:
        return self.namespace is None or key[0] == self.namespace
