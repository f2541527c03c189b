"""Leader election with one coordination.k8s.io Lease per namespace that has jobs.

Every operator instance — a Helm release, a second release, a local run for debugging, a
test's operator — competes for the Lease `multiworker-operator` in each namespace it watches
and acts only on jobs of namespaces whose Lease it holds. The Lease lives with the jobs, not
with the operator, so instances in different modes (cluster-wide and namespaced) still
exclude each other. The rule is client-go's: a holder renews every `renew_seconds` and stops
acting when it could not renew for `deadline_seconds`; a candidate takes over once the
record has not changed for `duration_seconds` by its own clock (no trust in other clocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from multiworker.api import names
from multiworker.clients import metrics
from multiworker.clients.kube import Cluster
from multiworker.clients.workqueue import jittered

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

DURATION_SECONDS = 15
RENEW_SECONDS = 5.0
DEADLINE_SECONDS = 10.0
LEASE_THREADS = 8  # namespaces renewed at once


class Move(StrEnum):
    CREATE = "Create"  # no Lease yet
    RENEW = "Renew"  # ours
    TAKE_OVER = "TakeOver"  # free or expired
    FOLLOW = "Follow"  # another live holder


@dataclass(frozen=True)
class Sighting:
    """A Lease record as a candidate saw it, and when (its own monotonic clock) it changed."""

    record: tuple[str, str, str]  # holder, renewTime, resourceVersion
    changed_at: float


def record_of(lease: Manifest) -> tuple[str, str, str]:
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("renewTime") or "",
            lease.get("metadata", {}).get("resourceVersion", ""))


def decide(lease: Manifest | None, identity: str, seen: Sighting | None, now: float
           ) -> tuple[Move, Sighting | None]:
    """What to do about one Lease, and the sighting to remember."""
    if lease is None:
        return Move.CREATE, None
    record = record_of(lease)
    if seen is None or seen.record != record:
        seen = Sighting(record, now)
    holder = record[0]
    if holder == identity:
        return Move.RENEW, seen
    duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or DURATION_SECONDS)
    if not holder or now - seen.changed_at >= duration:
        return Move.TAKE_OVER, seen
    return Move.FOLLOW, seen


def micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claimed(lease: Manifest | None, namespace: str, identity: str, now: datetime,
            duration: int, release: bool = False) -> Manifest:
    """The Lease with `identity` as holder (renewed, taken over or new); `release` hands it
    back so the next candidate need not wait out the duration."""
    old = lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": names.LEASE_NAME, "namespace": namespace}, "spec": {}}
    spec = dict(old.get("spec") or {})
    stamp = micro_time(now)
    if spec.get("holderIdentity") != identity:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
    spec.update(holderIdentity=identity, leaseDurationSeconds=duration, renewTime=stamp)
    if release:
        spec.update(holderIdentity=None, leaseDurationSeconds=1)
    return {**old, "spec": spec}


@dataclass
class Elector:
    """Holds the Leases of the namespaces `want`ed; `leads(ns)` gates every pass."""

    cluster: Cluster
    identity: str
    on_change: Callable[[str, bool], None]  # (namespace, now leading)
    duration: int = DURATION_SECONDS
    renew_seconds: float = RENEW_SECONDS
    deadline_seconds: float = DEADLINE_SECONDS
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    _wanted: set[str] = field(default_factory=set)
    _held: dict[str, tuple[Manifest, float]] = field(default_factory=dict)  # lease, renewed at
    _seen: dict[str, Sighting] = field(default_factory=dict)
    _announced: dict[str, bool] = field(default_factory=dict)  # as last told to on_change
    _following: dict[str, str] = field(default_factory=dict)  # holder we last said we wait for
    _kick: asyncio.Event = field(default_factory=asyncio.Event)
    _lapsed: dict[str, float] = field(default_factory=dict)  # renewed only after this gap
    # Threads of its own: Lease calls never queue behind reconcile passes (which share the
    # default executor and may each wait up to --request-timeout on a stalled API server).
    _calls: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(LEASE_THREADS, thread_name_prefix="lease"))

    def leads(self, namespace: str) -> bool:
        """Whether this instance may act in `namespace` now. A lapse (no renewal for the
        deadline) is announced the moment it is seen, and the renewal that ends it is announced
        again by the next step, so every pass skipped meanwhile runs again."""
        held = self._held.get(namespace)
        leading = held is not None and self.clock() - held[1] < self.deadline_seconds
        if not leading and self._announced.get(namespace):
            self._announce(namespace, False)
        return leading

    def want(self, namespaces: set[str]) -> None:
        """The namespaces with jobs: compete for their Leases (at once, for new ones)."""
        if namespaces - self._wanted:
            self._kick.set()
        self._wanted = set(namespaces)

    async def run(self) -> None:
        """Every namespace's round at once (API calls in threads, each bounded by the Lease
        call timeout), then the announcements here, on the event loop: one slow namespace never
        delays the renewal of the others."""
        while True:
            namespaces = sorted(self._wanted | set(self._held))
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._calls, self._round, ns)
                                   for ns in namespaces))
            for namespace in namespaces:
                self._settle(namespace)
            metrics.LEADING.set(sum(1 for ns in list(self._held) if self.leads(ns)))
            metrics.set_namespaces_leading({ns: self.leads(ns) for ns in self._wanted})
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), jittered(self.renew_seconds))

    async def release_all(self) -> None:
        """On shutdown: hand every Lease back, so another instance takes over at once."""
        for namespace in list(self._held):
            lease, _ = self._held.pop(namespace)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.cluster.replace_lease, claimed(
                    lease, namespace, self.identity, self.wall(), self.duration, release=True))
        metrics.LEADING.set(0)
        metrics.set_namespaces_leading({})

    def step(self, namespace: str) -> None:
        """One round for one namespace, then its announcement (what run() does for all)."""
        self._round(namespace)
        self._settle(namespace)

    def _round(self, namespace: str) -> None:
        """Renew, acquire, follow — or let go. API calls only: no announcement."""
        try:
            if namespace not in self._wanted:
                self._let_go(namespace)
            elif not (namespace in self._held and self._renew(namespace)):
                self._compete(namespace)
        except Exception as e:  # the API is down: keep trying; the deadline protects us
            log.warning("leader election in %s failed: %s", namespace, e)

    def _settle(self, namespace: str) -> None:
        """Announce whether this instance leads `namespace` if that differs from what was last
        announced — compared now, after the round, so a lapse seen during a slow renewal is
        followed by a new start."""
        gap = self._lapsed.pop(namespace, None)
        if gap is not None and self._announced.get(namespace):
            self._announce(namespace, False, f" (its Lease was renewed only {gap:.0f}s after "
                           f"the previous renewal, past the {self.deadline_seconds:.0f}s deadline)")
        leading = self.leads(namespace)
        if leading != self._announced.get(namespace, False):
            self._announce(namespace, leading)

    def _announce(self, namespace: str, leading: bool, why: str = "") -> None:
        self._announced[namespace] = leading
        if leading:
            log.info("handling the jobs of namespace %s", namespace)
        else:
            held = self._held.get(namespace)
            why = why or (f" (no renewal of its Lease for {self.clock() - held[1]:.0f}s)"
                          if held is not None else "")
            log.warning("no longer handling the jobs of namespace %s%s%s", namespace, why,
                        self._who(namespace))
        self.on_change(namespace, leading)

    def _renew(self, namespace: str) -> bool:
        lease, renewed = self._held[namespace]
        written = self.cluster.replace_lease(
            claimed(lease, namespace, self.identity, self.wall(), self.duration))
        if written is None:
            return False  # someone else wrote it: read and decide again
        gap = self.clock() - renewed
        if gap >= self.deadline_seconds:
            # It came back past the deadline: this instance did not lead in between, whether
            # or not a pass asked meanwhile. Said as a lapse and a new start (_settle).
            self._lapsed[namespace] = gap
        self._held[namespace] = (written, self.clock())
        return True

    def _compete(self, namespace: str) -> None:
        lease = self.cluster.get_lease(namespace, names.LEASE_NAME)
        move, seen = decide(lease, self.identity, self._seen.get(namespace), self.clock())
        if seen is not None:
            self._seen[namespace] = seen
        if move is not Move.FOLLOW:
            mine = claimed(lease, namespace, self.identity, self.wall(), self.duration)
            write = self.cluster.create_lease if move is Move.CREATE else \
                self.cluster.replace_lease
            written = write(mine)
            if written is not None:
                self._held[namespace] = (written, self.clock())
                self._following.pop(namespace, None)
                return
            lease = self.cluster.get_lease(namespace, names.LEASE_NAME)  # who won instead
        self._held.pop(namespace, None)
        holder = record_of(lease)[0] if lease is not None else "?"
        if self._following.get(namespace) != holder:
            self._following[namespace] = holder
            log.info("another operator instance handles the jobs of namespace %s (%s holds its "
                     "Lease %s): this instance waits", namespace, holder, names.LEASE_NAME)

    def _let_go(self, namespace: str) -> None:
        held = self._held.pop(namespace, None)
        if held is not None:
            self.cluster.replace_lease(claimed(held[0], namespace, self.identity, self.wall(),
                                               self.duration, release=True))

    def _who(self, namespace: str) -> str:
        seen = self._seen.get(namespace)
        return f": {seen.record[0]} holds its Lease" if seen and seen.record[0] else ""
