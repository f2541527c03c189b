"""The Kueue Workloads of jobs that are gone: each holds our finalizer (its quota is in use
until the job's pods are gone), and no pass will ever look at it again, so the controller
lets go of it here — when its job's deletion is seen, when a Workload event shows one orphaned
(decide/queueing.orphaned), and by a sweep of the cache when this instance takes the lead of
a namespace (the job went while no instance of ours led it: the operator down, a leader
change). Only the namespace's leader, with its caches synced, ever drops one: a Workload seen
before its job (two watches) is no orphan, and the leader made it from a cache that has the
job. A namespace with nothing but such a Workload is led for it (namespaces()).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from multiworker.api import names
from multiworker.clients.informer import Key
from multiworker.decide.queueing import FINALIZER, JOB_UID_LABEL, orphaned, workload_path
from multiworker.reconcile.view import View

log = logging.getLogger(__name__)

Manifest = dict[str, Any]


def workload_job(workload: Manifest) -> Key | None:
    meta = workload.get("metadata", {})
    job = (meta.get("labels") or {}).get(names.LABEL_JOB_NAME)
    return (meta.get("namespace", ""), job) if job else None


@dataclass
class GoneJobsWorkloads:
    view: View
    leads: Callable[[str], bool]  # whether this instance acts in a namespace now
    on_change: Callable[[], None]  # namespaces() changed: lead them
    synced: bool = False  # the first lists of jobs are in the cache
    _orphans: set[Key] = field(default_factory=set)  # Workloads, by (namespace, name)

    def namespaces(self) -> set[str]:
        return {namespace for namespace, _ in self._orphans}

    def __len__(self) -> int:
        return len(self._orphans)

    def on_event(self, new: Manifest | None, key: Key, job: Key) -> bool:
        """A Workload's event (`new` None: deleted); True when it is an orphan, let go of."""
        if self.synced and new is not None and orphaned(new, self.view.job_store.get(job)):
            # Its job is gone: the garbage collector deletes it once nothing holds it.
            self._orphans.add(key)
            self.on_change()
            self.release(new)
            return True
        if key in self._orphans:
            self._orphans.discard(key)
            self.on_change()
        return False

    def of_deleted_job(self, key: Key, job: Manifest) -> None:
        """A deleted job's Workloads. The job and Workload watches are separate streams, and
        either may lead: a Workload's last event (the garbage collector deleting it) can come
        while the job is still listed, and then no later event finds it orphaned."""
        uid = job["metadata"].get("uid")
        for workload in self.view.workload_store.by_index(key):
            if (workload["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == uid:
                self.release(workload)

    def sweep(self, namespace: str | None) -> None:
        """Every orphan in the cache (of `namespace`; None: all): their last event may have
        come before this instance led, and no later one would come."""
        known = len(self._orphans)
        for key in self.view.workload_store:
            workload = self.view.workload_store.get(key)
            job = workload_job(workload) if workload is not None else None
            if workload is None or job is None or namespace not in (None, key[0]):
                continue
            if orphaned(workload, self.view.job_store.get(job)):
                self._orphans.add(key)
                self.release(workload)
        if len(self._orphans) != known:
            self.on_change()

    def release(self, workload: Manifest) -> None:
        meta = workload["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []) or not self.synced or \
                not self.leads(meta.get("namespace", "")):
            return
        path = workload_path(meta.get("namespace", ""), meta["name"])

        def drop() -> None:
            try:
                self.view.cluster.drop_finalizer(path, workload, FINALIZER)
            except Exception as e:  # a conflict or an error: its next event retries
                log.info("releasing Workload %s of a deleted job: %s", path, e)

        asyncio.get_running_loop().run_in_executor(None, drop)
