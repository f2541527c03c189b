"""The invariants every chaos case checks, as pure functions of the events its own watch
recorded (recorder.py), in the order the API server sent them.

Definitions, for a pod P of job J (the MultiWorkerJob whose uid P's controlling
ownerReference names), with worker index i and group generation g (P's labels):

- P *exists* from the first event that shows it to its DELETED event.
- P is *alive* from the first event that shows it until the first event that shows its
  `deletionTimestamp`, or its DELETED event. The *terminating tail* — from the deletion
  request until the object is removed, while the kubelet stops the containers within their
  grace period — does not count as alive.

The invariants:

1. one pod per worker: for each job and index, the alive spans of two different pods never
   overlap;
2. one group at a time: a pod of generation g is created only once no pod of an earlier
   generation of its job exists — not even in its terminating tail (the new group never runs
   beside the old one, whose chief may still be writing the checkpoint);
3. nothing doubled: each worker of each generation is created once (one pod uid per job,
   generation and index);
4. no orphans: every pod of ours is controlled by a MultiWorkerJob the job watch showed
   before it. Pods created after their job's deletion are counted (`late`) — the garbage
   collector removes them — and `leftovers` names pods that outlive their job.

Events a re-list synthesized after the watch could not resume (`gap`) carry the list's
resourceVersion: what they show existed at once, but their order inside the gap is unknown,
so an overlap that started and ended inside a gap cannot be seen (gaps are reported).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.chaos.recorder import Event

JOB_KIND = "MultiWorkerJob"


@dataclass
class Report:
    """What the checks found: violations (must be empty) and figures."""

    violations: list[str] = field(default_factory=list)
    pods: int = 0  # distinct pods seen
    generations: dict[str, int] = field(default_factory=dict)  # job uid -> generations seen
    late: list[str] = field(default_factory=list)  # pods created after their job's deletion
    gap_events: int = 0

    def figures(self) -> str:
        return (f"{self.pods} pods of {len(self.generations)} jobs in "
                f"{sum(self.generations.values())} generations; {self.gap_events} events "
                f"seen only by a re-list; {len(self.late)} pods created after their job's "
                f"deletion; {len(self.violations)} violations")


def check(pods: Sequence[Event], jobs: Sequence[Event]) -> Report:
    report = Report(gap_events=sum(e.gap for e in pods))
    report.violations += one_pod_per_worker(pods)
    report.violations += one_group_at_a_time(pods)
    report.violations += created_once(pods)
    orphans, late = ownership(pods, jobs)
    report.violations += orphans
    report.late = late
    report.pods = len({e.uid for e in pods})
    seen: dict[str, set[int]] = defaultdict(set)
    for e in pods:
        if e.generation is not None:
            seen[e.owner].add(e.generation)
    report.generations = {uid: len(g) for uid, g in seen.items()}
    return report


def _ours(pods: Iterable[Event]) -> Iterable[Event]:
    return (e for e in pods if e.index is not None and e.generation is not None)


def one_pod_per_worker(pods: Sequence[Event]) -> list[str]:
    """Invariant 1: alive spans of one job's worker i never overlap."""
    alive: dict[tuple[str, int | None], Event] = {}
    seen: set[str] = set()
    found = []
    for e in _ours(pods):
        key = (e.owner, e.index)
        if e.uid not in seen:
            seen.add(e.uid)
            other = alive.get(key)
            if other is not None and other.uid != e.uid:
                found.append(f"two pods of worker {e.index} alive at once: {other.name} "
                             f"(generation {other.generation}, uid {other.uid}) and {e.name} "
                             f"(generation {e.generation}, uid {e.uid}) at rv {e.rv}")
            if not e.deleting and e.kind != "DELETED":
                alive[key] = e
        elif (e.deleting or e.kind == "DELETED") and alive.get(key, e).uid == e.uid:
            alive.pop(key, None)
    return found


def one_group_at_a_time(pods: Sequence[Event]) -> list[str]:
    """Invariant 2: no pod of generation g is created while one of generation < g exists."""
    existing: dict[str, dict[str, Event]] = defaultdict(dict)
    found = []
    for e in _ours(pods):
        group = existing[e.owner]
        if e.kind == "DELETED":
            group.pop(e.uid, None)
            continue
        if e.uid in group:
            group[e.uid] = e
            continue
        assert e.generation is not None
        older = sorted((o for o in group.values()
                        if o.generation is not None and o.generation < e.generation),
                       key=lambda o: o.name)
        if older:
            names = ", ".join(f"{o.name} (generation {o.generation}"
                              f"{', terminating' if o.deleting else ''})" for o in older)
            found.append(f"{e.name} of generation {e.generation} created at rv {e.rv} while "
                         f"{names} still existed")
        group[e.uid] = e
    return found


def created_once(pods: Sequence[Event]) -> list[str]:
    """Invariant 3: one pod uid per job, generation and worker index."""
    uids: dict[tuple[str, int | None, int | None], list[str]] = defaultdict(list)
    for e in _ours(pods):
        key = (e.owner, e.generation, e.index)
        if e.uid not in uids[key]:
            uids[key].append(e.uid)
    return [f"worker {index} of generation {generation} (job uid {owner}) was created "
            f"{len(found)} times: uids {', '.join(found)}"
            for (owner, generation, index), found in uids.items() if len(found) > 1]


def ownership(pods: Sequence[Event], jobs: Sequence[Event]) -> tuple[list[str], list[str]]:
    """Invariant 4: (orphans, pods created after their job's deletion)."""
    created: dict[str, int] = {}
    deleted: dict[str, int] = {}
    for j in jobs:
        created.setdefault(j.uid, j.rv)
        if (j.deleting or j.kind == "DELETED") and j.uid not in deleted:
            deleted[j.uid] = j.rv
    orphans, late, seen = [], [], set()
    for e in pods:
        if e.uid in seen:
            continue
        seen.add(e.uid)
        if e.owner_kind != JOB_KIND or not e.owner:
            orphans.append(f"{e.name} (uid {e.uid}) is controlled by no MultiWorkerJob")
        elif e.owner not in created:
            orphans.append(f"{e.name} (uid {e.uid}) is controlled by job uid {e.owner}, "
                           "which the job watch never showed")
        elif e.owner in deleted and e.rv > deleted[e.owner]:
            late.append(f"{e.name} (generation {e.generation}) at rv {e.rv}, after its job's "
                        f"deletion at rv {deleted[e.owner]}")
    return orphans, late


def leftovers(live_pods: Iterable[Event], live_jobs: Iterable[str]) -> list[str]:
    """Pods that exist although their job is gone (ask once the garbage collector had time)."""
    jobs = set(live_jobs)
    return [f"{e.name} (uid {e.uid}) outlived its job (uid {e.owner})"
            for e in live_pods if e.owner not in jobs]
