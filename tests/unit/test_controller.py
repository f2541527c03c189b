"""The controller's bookkeeping around passes: our own status writes are read back at once
and never mistaken for news; kopf is only the process runner."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from multiworker.clients.informer import Store
from multiworker.clients.leader import Elector
from multiworker.controller import Controller
from multiworker.decide.queueing import FINALIZER, JOB_UID_LABEL
from multiworker.handlers import operator_settings
from multiworker.reconcile.view import View

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.test_leader import Clock, LeaseAPI

KEY = (NAMESPACE, "demo")


def versioned(version: str, **status: Any) -> dict[str, Any]:
    body = job_body()
    body["metadata"]["resourceVersion"] = version
    body["status"] = status
    return body


def test_a_pass_reads_our_own_write_until_the_cache_catches_up() -> None:
    jobs = Store()
    view = View(None, jobs, Store(), Store())  # type: ignore[arg-type]
    jobs.put(versioned("5", groupGeneration=0))
    view.remember_write(KEY, "5", versioned("6", groupGeneration=1))
    cached = view.cached_job(*KEY)
    assert cached is not None and cached["status"]["groupGeneration"] == 1  # ours, not stale
    jobs.put(versioned("6", groupGeneration=1))  # the watch delivered our write
    assert view.cached_job(*KEY)["status"]["groupGeneration"] == 1  # type: ignore[index]
    assert KEY not in view.written
    view.remember_write(KEY, "6", versioned("7", groupGeneration=2))
    jobs.put(versioned("8", groupGeneration=5))  # someone else wrote after us: theirs wins
    assert view.cached_job(*KEY)["status"]["groupGeneration"] == 5  # type: ignore[index]


def test_two_quick_writes_leave_no_stale_read_between_them() -> None:
    """The second write of ours lands before the cache shows the first: the cache two versions
    behind must still read as our latest write (it read as the stale version, and the next pass
    wrote against it and looped on 409s)."""
    jobs = Store()
    view = View(None, jobs, Store(), Store())  # type: ignore[arg-type]
    jobs.put(versioned("5", groupGeneration=0))
    view.remember_write(KEY, "5", versioned("6", groupGeneration=1))
    view.remember_write(KEY, "6", versioned("7", groupGeneration=2))  # the cache still at 5
    assert view.cached_job(*KEY)["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    jobs.put(versioned("6", groupGeneration=1))  # our first write, delivered
    assert view.cached_job(*KEY)["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    jobs.put(versioned("7", groupGeneration=2))
    assert view.cached_job(*KEY)["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    assert KEY not in view.written


def test_the_event_of_our_own_write_wakes_nothing() -> None:
    controller = Controller(None, ["ml"], None)  # type: ignore[arg-type]
    controller.view.remember_write(KEY, "5", versioned("6"))
    controller._on_job("MODIFIED", versioned("5"), versioned("6"))
    assert len(controller.queue) == 0
    controller._on_job("MODIFIED", versioned("6"), versioned("7"))  # a user's edit
    assert len(controller.queue) == 1


def test_a_job_per_namespace_is_counted_for_leader_election() -> None:
    controller = Controller(None, ["ml"], None)  # type: ignore[arg-type]
    controller._on_job("ADDED", None, versioned("1"))
    assert controller._jobs_per_namespace == {NAMESPACE: 1}
    controller._on_job("DELETED", versioned("1"), None)
    assert controller._jobs_per_namespace == {}


def test_kopf_only_runs_the_process() -> None:
    settings = operator_settings()
    assert settings.scanning.disabled and settings.peering.standalone
    assert settings.posting.enabled is False


def test_a_pass_skipped_during_a_lease_lapse_runs_again_once_the_lease_is_renewed() -> None:
    """Before: the pass was dropped and, since the renewal flipped nothing inside one step,
    never requeued; a worker that hung afterwards was never restarted."""
    api, clock = LeaseAPI(), Clock()
    controller = Controller(None, [NAMESPACE], "me")  # type: ignore[arg-type]
    controller.elector = Elector(api, "me", controller._leadership_changed,  # type: ignore[arg-type]
                                 clock=clock)
    controller.view.job_store.put(versioned("1"))
    controller.elector.want({NAMESPACE})
    controller.elector.step(NAMESPACE)
    controller.queue = type(controller.queue)()  # what leading queued: done
    clock.t += 11  # the renewal is late: past the deadline
    asyncio.run(controller.passes.process(KEY))  # a due pass: skipped, not leading
    assert len(controller.queue) == 0
    controller.elector.step(NAMESPACE)  # the renewal lands
    assert len(controller.queue) == 1


def test_a_created_pod_the_watch_already_showed_is_not_expected_again() -> None:
    """The ADDED event of a pod this pass created can arrive before the pass ends; recording
    it as expected after that kept it 60 s, so a pod deleted in that window read as Creating
    instead of missing (a disruption seen a minute late)."""
    from datetime import UTC, datetime

    from multiworker.reconcile.context import Outcome

    controller = Controller(None, [NAMESPACE], None)  # type: ignore[arg-type]
    controller.view.job_store.put(job_body())
    pod = {"metadata": {"name": "demo-worker-0", "namespace": NAMESPACE,
                        "labels": {"multiworker.dev/job-name": "demo"}}, "spec": {}}
    began = time.monotonic()

    async def pass_ends() -> None:  # (the events and the resync are queued on the loop)
        controller._on_pod("ADDED", None, pod)  # the watch is faster than the pass
        controller._on_pod("DELETED", pod, None)  # and the pod is gone at once
        controller.passes.after(KEY, Outcome(created=("demo-worker-0", "demo-worker-1")),
                                datetime.now(UTC), began)

    asyncio.run(pass_ends())
    assert controller.passes.still_expected(KEY) == frozenset({"demo-worker-1"})


def test_pod_events_of_a_large_group_wake_its_job_once_after_a_batch_period() -> None:
    """A pass reads the whole group: 1,024 workers' events within 0.5 s make one pass, not
    one each; an 8-worker job waits 25 ms, 64 workers 32 ms."""
    from multiworker.controller.controller import (
        POD_BATCH_MAX_SECONDS,
        _pod_batch_seconds,
    )

    controller = Controller(None, [NAMESPACE], None)  # type: ignore[arg-type]
    controller.view.job_store.put(job_body(workers=1024))

    def pod(i: int) -> dict[str, Any]:
        return {"metadata": {"name": f"demo-worker-{i}", "namespace": NAMESPACE,
                             "labels": {"multiworker.dev/job-name": "demo"}}, "spec": {}}

    async def events() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(200):
            controller._on_pod("ADDED", None, pod(i))
        assert await asyncio.wait_for(controller.queue.get(), 2) == KEY
        waited = loop.time() - start
        controller.queue.done(KEY)
        return waited, len(controller.queue)

    waited, left = asyncio.run(events())
    assert waited >= POD_BATCH_MAX_SECONDS * 0.9 and left == 0  # one pass for all 200
    assert _pod_batch_seconds(job_body(workers=8)) == 0.025
    assert _pod_batch_seconds(job_body(workers=64)) == 0.032


def test_pod_events_of_a_job_gone_wake_nothing_and_leave_nothing() -> None:
    """Deleting a job deletes its pods (the garbage collector): their events woke a pass each
    (~10 for a group of 8) with nothing to do, and kept their names until the next pass."""
    controller = Controller(None, [NAMESPACE], None)  # type: ignore[arg-type]
    pod = {"metadata": {"name": "demo-worker-0", "namespace": NAMESPACE,
                        "labels": {"multiworker.dev/job-name": "demo"}},
           "spec": {"nodeName": "node-1"}}
    controller._on_pod("ADDED", None, pod)
    controller._on_pod("DELETED", pod, None)
    assert len(controller.queue) == 0 and not controller.passes._pod_seen
    assert controller._pods_by_node.indexes() == []
    controller.view.job_store.put(job_body())

    async def added() -> None:  # (the pass is queued on the loop)
        controller._on_pod("ADDED", None, pod)

    asyncio.run(added())
    assert controller._pods_by_node.indexes() == [("", "node-1")]
    assert KEY in controller.passes._pod_seen


class FinalizerLog:
    """The one cluster call a released Workload makes."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def drop_finalizer(self, path: str, obj: dict[str, Any], finalizer: str) -> None:
        self.dropped.append(obj["metadata"]["name"])


def test_a_deleted_jobs_workload_is_released_whichever_watch_delivers_first() -> None:
    """The garbage collector's update of the Workload can arrive while the job is still
    listed (two watches, either may lag): then the job's DELETED releases it, and only the
    Workloads of that job (its uid), not of a job re-created under its name."""
    cluster = FinalizerLog()
    controller = Controller(cluster, [NAMESPACE], None)  # type: ignore[arg-type]
    controller.workloads.synced = True  # started: its first lists are in
    job = job_body()

    def workload(name: str, uid: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": NAMESPACE,
                             "labels": {"multiworker.dev/job-name": "demo",
                                        JOB_UID_LABEL: uid},
                             "finalizers": [FINALIZER],
                             "deletionTimestamp": "2026-11-28T00:00:00Z"}}

    ours, theirs = workload("demo-1", job["metadata"]["uid"]), workload("demo-2", "a-new-uid")

    async def events() -> None:
        controller.view.job_store.put(job)
        for w in (ours, theirs):
            controller.view.workload_store.put(w)
            controller._on_workload("MODIFIED", w, w)  # the job still listed: a pass, no release
        await asyncio.sleep(0.1)
        assert cluster.dropped == []
        controller.view.job_store.remove(KEY)
        controller._on_job("DELETED", job, None)
        await asyncio.sleep(0.1)  # (the release runs in an executor)

    asyncio.run(events())
    assert cluster.dropped == ["demo-1"]


def test_a_workload_whose_job_went_while_no_instance_led_is_released_by_the_next_leader() -> None:
    """The job was deleted while no operator led its namespace (down, upgrading, a leader
    change): the garbage collector's deletion of its Workload waits on our finalizer, and that
    Workload's last event reached the next instance before it led (or its namespace, with no
    job left, was led by none). Taking the lead sweeps the cache; a namespace with nothing
    but such a Workload is led for it."""
    api, clock, cluster = LeaseAPI(), Clock(), FinalizerLog()
    controller = Controller(cluster, [NAMESPACE], "me")  # type: ignore[arg-type]
    controller.elector = Elector(api, "me", controller._leadership_changed,  # type: ignore[arg-type]
                                 clock=clock)

    def workload(name: str, job: str, deleting: bool = True) -> dict[str, Any]:
        meta = {"name": name, "namespace": NAMESPACE, "finalizers": [FINALIZER],
                "labels": {"multiworker.dev/job-name": job, JOB_UID_LABEL: "old-uid"}}
        return {"metadata": meta | ({"deletionTimestamp": "2026-11-28T00:00:00Z"}
                                    if deleting else {})}

    gone, live = workload("gone-1", "gone"), workload("demo-1", "demo", deleting=False)
    being_made = workload("new-1", "new", deleting=False)  # its job not seen yet: no orphan

    async def events() -> None:
        for w in (gone, live, being_made):
            controller.view.workload_store.put(w)
            controller._on_workload("ADDED", None, w)  # the first lists, caches not synced
        controller.view.job_store.put(job_body())
        controller.workloads.synced = True
        controller.workloads.sweep(None)  # as start() does once synced: not leading yet
        await asyncio.sleep(0.1)
        assert cluster.dropped == []
        assert controller.elector is not None and controller.elector._wanted == {NAMESPACE}
        controller.elector.step(NAMESPACE)  # this instance takes the lead
        await asyncio.sleep(0.1)  # (the release runs in an executor)

    asyncio.run(events())
    assert cluster.dropped == ["gone-1"]


def test_a_namespace_with_only_an_orphaned_workload_is_led_until_it_is_let_go() -> None:
    controller = Controller(FinalizerLog(), [NAMESPACE], "me")  # type: ignore[arg-type]
    controller.elector = Elector(LeaseAPI(), "me", controller._leadership_changed,  # type: ignore[arg-type]
                                 clock=Clock())
    controller.workloads.synced = True
    orphan = {"metadata": {"name": "gone-1", "namespace": NAMESPACE, "finalizers": [FINALIZER],
                           "deletionTimestamp": "2026-11-28T00:00:00Z",
                           "labels": {"multiworker.dev/job-name": "gone"}}}
    controller._on_workload("MODIFIED", orphan, orphan)
    assert controller.elector._wanted == {NAMESPACE}
    released = {"metadata": {**orphan["metadata"], "finalizers": []}}
    controller._on_workload("MODIFIED", orphan, released)
    assert controller.elector._wanted == set()


def test_a_node_with_new_room_wakes_the_jobs_held_back_and_a_heartbeat_wakes_none() -> None:
    """A job no GPU product holds retries every 30 s; a node added (or given GPUs, a label, a
    taint lifted) is what it waits for, so its pass comes at once. Other jobs stay asleep."""
    controller = Controller(None, [NAMESPACE], None)  # type: ignore[arg-type]
    held = versioned("5", blockedSince="2026-11-30T00:00:00Z")
    held["metadata"]["name"] = "held"
    controller.view.job_store.put(held)
    controller.view.job_store.put(versioned("6"))  # "demo": running, not held back
    fresh = {"metadata": {"name": "gpu-0"}, "spec": {}, "status": {}}
    controller._on_node("ADDED", None, fresh)
    assert len(controller.queue) == 0  # the initial list: start() queues every job once synced
    controller._caches_synced = True

    def node(**allocatable: str) -> dict[str, Any]:
        return {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "H100"}},
                "spec": {"taints": []}, "status": {"allocatable": allocatable, "conditions": []}}

    def woken() -> set[tuple[str, str]]:
        async def drain() -> set[tuple[str, str]]:
            keys = set()
            while controller.queue.waiting():
                key = await controller.queue.get()
                controller.queue.done(key)
                keys.add(key)
            return keys
        return asyncio.run(drain())

    controller._on_node("ADDED", None, node(**{"nvidia.com/gpu": "8"}))
    assert woken() == {(NAMESPACE, "held")}
    eight, none = node(**{"nvidia.com/gpu": "8"}), node(**{"nvidia.com/gpu": "0"})
    controller._on_node("MODIFIED", eight, eight)
    assert woken() == set()  # a heartbeat: the same room
    controller._on_node("MODIFIED", none, eight)
    assert woken() == {(NAMESPACE, "held")}
    controller._on_node("DELETED", eight, None)
    assert woken() == set()  # no room comes from a node gone
