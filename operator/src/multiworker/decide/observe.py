"""Pure observation: the job's pods (API dicts) sorted into the state of its worker group —
the current generation's workers by index (each classified by workers.py), the stale pods of
older generations, and pods with our labels that another controller owns — remembered
between passes (Classified), so a pass reworks only the pods that changed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from multiworker.api import names
from multiworker.decide.ownership import controlled_by
from multiworker.decide.workers import (
    Pod,
    WorkerPhase,
    WorkerState,
    classify,
    int_or_none,
    parse_time,
)


@dataclass(frozen=True)
class StalePod:
    """A pod of the job that does not belong to the current group."""

    name: str
    uid: str
    generation: int | None
    deletion: datetime | None  # when the API server will remove it (already terminating)
    node: str = ""  # where it runs: a pod on a lost node never terminates by itself
    pod_group: str = ""  # its gang's PodGroup, which goes with it
    ip: str = ""  # where its in-place restart agent listens
    index: int | None = None  # its worker index label


@dataclass(frozen=True)
class ObservedGroup:
    """A pass's view of the group; read many times per pass, so its counts are kept."""

    generation: int
    workers: tuple[WorkerState, ...]
    stale: tuple[StalePod, ...] = ()
    foreign: tuple[str, ...] = ()  # our labels, but another controller: never touched

    def with_phase(self, *phases: WorkerPhase) -> list[WorkerState]:
        return [w for w in self.workers if w.phase in phases]

    @cached_property
    def ready(self) -> int:
        return sum(1 for w in self.workers if w.phase is WorkerPhase.RUNNING and w.ready)

    @cached_property
    def all_running(self) -> bool:
        """Every worker runs (or has already finished successfully, waiting for the others)."""
        return all(w.phase in (WorkerPhase.RUNNING, WorkerPhase.SUCCEEDED) for w in self.workers)

    @cached_property
    def has_pods(self) -> bool:
        return any(w.phase is not WorkerPhase.MISSING for w in self.workers)


# Where one pod of a job goes: (worker index, its state) for the current group, a StalePod,
# or the name of a foreign pod.
Sorted = tuple[int, WorkerState] | StalePod | str


class Classified:
    """Where each pod of one job was sorted (and its state), by uid, at the resource version
    read: a pass after one pod event sorts and classifies that pod alone and reuses the
    others', so a pass's costly work grows with what changed, not with the group. One per
    job; passes over one job never run at once (workqueue.py), so it needs no lock."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[tuple[Any, ...], Sorted]] = {}
        self._seen: dict[tuple[Any, ...], datetime] = {}  # failures, by pod uid and identity
        self.computed = 0  # pods sorted afresh: what the incremental path saves

    def sort(self, pod: Pod, context: tuple[Any, ...]) -> Sorted:
        meta = pod.get("metadata", {})
        uid, version = meta.get("uid", ""), meta.get("resourceVersion", "")
        seen = (version, *context)
        held = self._by_uid.get(uid)
        if held is not None and held[0] == seen and uid and version:
            return held[1]
        found = _sort(pod, *context)
        self.computed += 1
        if uid and version:
            self._by_uid[uid] = (seen, found)
        return found

    def first_seen(self, worker: WorkerState, now: datetime) -> datetime:
        """When this process first saw `worker`'s failure (a new process: now — later than
        the truth, so a window only ever grows)."""
        key = (worker.uid, worker.phase, worker.reason, worker.exit_code, worker.since,
               worker.trainer_restarts)
        return self._seen.setdefault(key, now)

    def retain(self, count: int, uids: Iterable[str]) -> None:
        """Forget the pods that are gone (the job has `count` pods now)."""
        if len(self._by_uid) > count or len(self._seen) > count:
            keep = set(uids)
            self._by_uid = {u: v for u, v in self._by_uid.items() if u in keep}
            self._seen = {k: v for k, v in self._seen.items() if k[0] in keep}


def _sort(pod: Pod, job: str, job_uid: str, workers: int, generation: int,
          container: str) -> Sorted:
    meta = pod.get("metadata", {})
    if not controlled_by(meta, job_uid):
        return str(meta.get("name", ""))
    labels = meta.get("labels", {})
    index = int_or_none(labels.get(names.LABEL_WORKER_INDEX))
    pod_generation = int_or_none(labels.get(names.LABEL_GROUP_GENERATION))
    if (pod_generation == generation and index is not None and 0 <= index < workers
            and meta.get("name") == names.worker_name(job, index)):
        return index, classify(pod, index, container)
    return StalePod(
        name=meta.get("name", ""), uid=meta.get("uid", ""), generation=pod_generation,
        deletion=parse_time(meta.get("deletionTimestamp")),
        node=(pod.get("spec") or {}).get("nodeName") or "",
        pod_group=labels.get(names.LABEL_POD_GROUP, ""),
        ip=(pod.get("status") or {}).get("podIP") or "", index=index,
    )


def observe_group(
    pods: Collection[Pod], *, job: str, job_uid: str, workers: int, generation: int,
    container: str, expected: Collection[str] = (), classified: Classified | None = None,
    now: datetime | None = None,
) -> ObservedGroup:
    """Sort the job's pods into the current group (by worker index), stale and foreign pods.
    A pod of `expected` (created, not yet seen by the cache) is pending, not missing.
    `classified` keeps each pod's place and state between passes (once per pod version) and
    when each failure was first seen (`now`, the operator's clock: WorkerState.seen_at)."""
    current: dict[int, WorkerState] = {}
    stale: list[StalePod] = []
    foreign: list[str] = []
    context = (job, job_uid, workers, generation, container)
    for pod in pods:
        found = classified.sort(pod, context) if classified is not None \
            else _sort(pod, *context)
        if isinstance(found, tuple):
            current[found[0]] = found[1]
        elif isinstance(found, StalePod):
            stale.append(found)
        else:
            foreign.append(found)
    def absent(i: int) -> WorkerState:
        pod = names.worker_name(job, i)
        if pod in expected:
            return WorkerState(i, WorkerPhase.PENDING, pod, reason="Creating")
        return WorkerState(index=i, phase=WorkerPhase.MISSING)

    group = tuple(_seen(current.get(i) or absent(i), classified, now) for i in range(workers))
    if classified is not None:
        classified.retain(len(pods), (p.get("metadata", {}).get("uid", "") for p in pods))
    return ObservedGroup(generation, group, tuple(stale), tuple(sorted(foreign)))


def _seen(worker: WorkerState, classified: Classified | None, now: datetime | None
          ) -> WorkerState:
    """`worker` with its seen_at: first seen by this process, or without a memory its own
    time, never later than now (a node's clock may run ahead)."""
    if worker.phase not in (WorkerPhase.FAILED, WorkerPhase.DISRUPTED):
        return worker
    if classified is not None and now is not None:
        return replace(worker, seen_at=classified.first_seen(worker, now))
    seen = worker.since if now is None or worker.since is None else min(worker.since, now)
    return replace(worker, seen_at=seen or now)


