"""decide/elastic.py: when a group's next generation is smaller or larger, and how much room
the nodes have for its workers."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from multiworker.api.job import Job
from multiworker.decide.elastic import (
    ElasticPolicy,
    Resize,
    Seen,
    next_look,
    next_size,
    refused_since,
    room,
)
from multiworker.reconcile.reconcile import reconcile

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.fake_cluster import FakeCluster
from tests.unit.test_reconcile import GPU_TEMPLATE
from tests.unit.test_render import env_of_job

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POLICY = ElasticPolicy(min_workers=2, max_workers=4, shrink_after=timedelta(seconds=60),
                       grow_after=timedelta(seconds=120))


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def seen(workers: int = 4, placed: int = 4, refused: float | None = None, room: int = 0,
         room_for: float | None = None, resized: float | None = None) -> Seen:
    return Seen(workers=workers, placed=placed,
                refused_since=ago(refused) if refused is not None else None,
                room=room, room_since=ago(room_for) if room_for is not None else None,
                resized_at=ago(resized) if resized is not None else None)


@pytest.mark.parametrize(("state", "size"), [
    # shrinking: only after shrinkAfter, to what is placed, never below minWorkers
    (seen(placed=3, refused=59), None),
    (seen(placed=3, refused=60), 3),
    (seen(placed=1, refused=600), 2),
    (seen(placed=0, refused=600), 2),  # nothing placed: the smallest allowed group
    (seen(workers=2, placed=1, refused=600), None),  # at minWorkers already: it waits
    (seen(placed=4, refused=600), None),  # every pod bound (a refusal about to clear)
    # growing: room beyond the current size that lasted growAfter, also since the last resize
    (seen(workers=3, room=4, room_for=119), None),
    (seen(workers=3, room=4, room_for=120), 4),
    (seen(workers=2, room=9, room_for=500), 4),  # never above spec.workers
    (seen(workers=2, room=3, room_for=500), 3),
    (seen(workers=3, room=4, room_for=500, resized=60), None),  # just shrunk: no flapping
    (seen(workers=3, room=4, room_for=500, resized=120), 4),
    (seen(workers=3, room=3, room_for=500), None),  # no room beyond itself
    (seen(workers=4, room=8, room_for=500), None),  # full size
    (seen(workers=3, placed=2, refused=10, room=4, room_for=500), None),  # refused: no growing
    # minWorkers edited above a shrunk size: that size at once, room or not, refused or not
    (seen(workers=1, placed=1), 2),
    (seen(workers=1, placed=0, refused=600), 2),
])
def test_the_next_generation_s_size(state: Seen, size: int | None) -> None:
    decided = next_size(POLICY, state, NOW)
    assert (decided.workers if decided else None) == size


@pytest.mark.parametrize(("state", "after"), [
    (seen(placed=3, refused=50), 10),  # the shrink's wait ends in 10 s
    (seen(workers=2, placed=1, refused=600), None),  # at minWorkers: only a change helps
    (seen(workers=2, placed=1, refused=30), None),  # ... however long it has waited
    (seen(placed=4, refused=600), None),  # every pod bound: its event comes
    (seen(workers=3, room=4, room_for=100), 20),  # the growth's wait ends in 20 s
    (seen(workers=3, room=4, room_for=500, resized=60), 60),
    (seen(workers=4, room=8, room_for=500), None),  # full size
    (seen(workers=3, room=3, room_for=500), None),  # no room beyond itself
    (seen(), None),
])
def test_the_next_look_is_when_a_wait_ends_never_a_moment_past(
    state: Seen, after: float | None
) -> None:
    at = next_look(POLICY, state, NOW)
    assert (None if at is None else (at - NOW).total_seconds()) == after
    assert next_size(POLICY, state, NOW) is None


def test_a_group_refused_at_min_workers_does_not_spin() -> None:
    """Reproduced: 956 of 1,000 passes asked to run again at once, on one core, until the
    start-up timeout (none set: for ever)."""
    cluster = FakeCluster(job_body(workers=2, elastic={"minWorkers": 2},
                                   health={"startupTimeoutSeconds": None}))
    _step(cluster)
    cluster.run(0)
    refused(cluster, 1)
    requeues = [_step(cluster, 30).requeue for _ in range(10)]  # 300 s: long past the wait
    assert cluster.status["groupGeneration"] == 0
    assert all(r is None or r > 0 for r in requeues), requeues


def test_each_resize_says_why_and_names_the_capacity() -> None:
    refusal = "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had " \
              "untolerated taint {node.kubernetes.io/unreachable: }."
    shrunk = next_size(POLICY, replace(seen(placed=3, refused=75), refusal=refusal), NOW)
    assert shrunk == Resize(3, "1 of 4 workers could not be placed for 75s "
                               "(spec.elastic.shrinkAfterSeconds 60): training on with 3 "
                               f"(minWorkers 2); the scheduler: {refusal}")
    grown = next_size(POLICY, replace(seen(workers=2, room=3, room_for=130, resized=400),
                                      room_on=(("node-a", 2), ("node-b", 0), ("node-c", 1))),
                      NOW)
    assert grown == Resize(3, "room for 1 more workers for 130s: growing from 2 to 3 of 4 "
                              "(workers each node holds: node-a 2, node-c 1)")
    assert grown.grows(2) and not shrunk.grows(4)
    long = next_size(POLICY, replace(seen(placed=3, refused=75), refusal="x" * 400), NOW)
    assert long is not None and long.why.endswith("x…") and len(long.why) < 450


def test_the_longest_refused_pod_is_the_one_counted_and_quoted() -> None:
    def pod(stamp: str, message: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                           "reason": "Unschedulable", "message": message,
                                           "lastTransitionTime": stamp}]}}
    scheduled = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert refused_since([scheduled]) == (None, "")
    assert refused_since([pod("2026-01-01T12:00:10Z", "later"), scheduled,
                          pod("2026-01-01T12:00:00Z", "first")]) == \
        (datetime(2026, 1, 1, 12, 0, tzinfo=UTC), "first")


def node(name: str, gpus: int = 4, cpu: str = "16", ready: bool = True,
         **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}, "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def pod(on: str | None, gpus: int = 1, cpu: str = "1", owner: str = "someone-else",
        phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"ownerReferences": [{"controller": True, "uid": owner}]},
            "spec": {"nodeName": on, "containers": [{"resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


WORKER = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"},
                                        "requests": {"cpu": "2", "memory": "4Gi"}}}]}


@pytest.mark.parametrize(("nodes", "pods", "fits"), [
    ([node("a")], [], 4),  # 4 GPUs
    ([node("a"), node("b")], [], 8),
    ([node("a")], [pod("a")], 3),  # another job's pod holds one GPU
    ([node("a")], [pod("a", owner="job")], 4),  # the job's own pods are being replaced
    ([node("a")], [pod(None)], 4),  # pending pods hold nothing
    ([node("a")], [pod("a", phase="Succeeded")], 4),  # finished ones neither
    ([node("a", cpu="5")], [], 2),  # the CPU runs out first: 2 × 2 cores
    ([node("a", cpu="5")], [pod("a", gpus=0, cpu="1")], 2),
    ([node("a", cpu="5")], [pod("a", gpus=0, cpu="2")], 1),
    ([node("a", ready=False)], [], 0),  # a node lost
    ([node("a", unschedulable=True)], [], 0),  # cordoned
    ([node("a", taints=[{"key": "k", "effect": "NoSchedule"}])], [], 0),
    ([node("a", gpus=0)], [], 0),
    ([node("a")], [pod("a", gpus=4)], 0),
])
def test_room_for_workers(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                          fits: int) -> None:
    assert room(nodes, pods, WORKER, "job") == fits


def test_a_worker_that_requests_nothing_fits_nowhere_by_this_count() -> None:
    assert room([node("a")], [], {"containers": [{"name": "tensorflow"}]}, "job") == 0


# --- the size flows from status.groupWorkers into everything a group is made of ---


def elastic_cluster(group_workers: int | None, elastic: bool = True) -> FakeCluster:
    body = job_body(workers=3, **({"elastic": {"minWorkers": 2}} if elastic else {}))
    body["status"] = {"groupWorkers": group_workers} if group_workers else {}
    return FakeCluster(body)


def test_a_shrunk_group_is_made_at_its_size_and_knows_the_full_one() -> None:
    cluster = elastic_cluster(2)
    reconcile(cluster, NAMESPACE, "demo", cluster.now)
    assert sorted(cluster.pods) == ["demo-worker-0", "demo-worker-1"]
    assert (cluster.status["totalWorkers"], cluster.status["ready"], cluster.status["size"]) == \
        (2, "0/2", "2/3")
    job = Job.from_body(cluster.job).at_size(2)
    env = env_of_job(job, 1)
    assert (env["MWJ_NUM_WORKERS"], env["MWJ_MAX_WORKERS"], env["MWJ_ELASTIC_BATCH"]) == \
        ("2", "3", "KeepGlobal")
    assert len(json.loads(env["TF_CONFIG"])["cluster"]["worker"]) == 2


@pytest.mark.parametrize(("group_workers", "elastic", "pods"), [
    (None, True, 3),  # never resized
    (3, True, 3),
    (2, False, 3),  # not elastic (a status from before the field was removed): full size
    (4, True, 3),  # spec.workers edited below the shrunk size: whole at the new size
])
def test_only_an_elastic_job_s_group_size_differs_from_spec_workers(
    group_workers: int | None, elastic: bool, pods: int
) -> None:
    cluster = elastic_cluster(group_workers, elastic)
    reconcile(cluster, NAMESPACE, "demo", cluster.now)
    assert len(cluster.pods) == pods


# --- the step (reconcile/elastic.py) ---


def _step(cluster: FakeCluster, seconds: float = 1) -> Any:
    cluster.now += timedelta(seconds=seconds)
    return reconcile(cluster, NAMESPACE, "demo", cluster.now)


def refused(cluster: FakeCluster, index: int, skew: float = 0) -> None:
    """The scheduler refuses worker `index` (its clock `skew` s off), and the pod's update
    wakes the job at once."""
    cluster.unschedulable(index, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    pod = cluster.pods[f"demo-worker-{index}"]
    pod["status"]["conditions"][0]["lastTransitionTime"] = (
        cluster.now + timedelta(seconds=skew)).isoformat()
    _step(cluster, 0)


def test_a_group_that_cannot_be_placed_whole_shrinks_after_the_wait_spending_nothing() -> None:
    cluster = elastic_cluster(None)
    _step(cluster)
    cluster.run(0, 1)
    refused(cluster, 2)
    _step(cluster, 59)
    assert cluster.status["groupGeneration"] == 0
    _step(cluster, 2)  # 61 s refused: the next generation has the 2 that fit
    status = cluster.status
    assert (status["groupGeneration"], status["groupWorkers"], status["resizes"]) == (1, 2, 1)
    assert (status.get("restarts", 0), status.get("disruptions", 0)) == (0, 0)
    reason, message = cluster.events[-1][1:]
    assert reason == "Shrunk" and "1 of 3 workers could not be placed for 61s" in message
    assert message.endswith("the scheduler: 0/1 nodes are available: 1 Insufficient "
                            "nvidia.com/gpu.")
    _step(cluster)  # the old pods go with their grace period (the SIGTERM checkpoint)
    cluster.finish_deletions()
    _step(cluster)
    assert sorted(cluster.pods) == ["demo-worker-0", "demo-worker-1"]
    assert cluster.generations() == {"demo-worker-0": "1", "demo-worker-1": "1"}


def gpu_node(gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": "node-1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64",
                                       "memory": "256Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def shrunk_to_2(workers: int, gpus: int) -> FakeCluster:
    """A job of `workers` (minWorkers 2) whose group runs shrunk to 2 on a node of `gpus`."""
    cluster = FakeCluster(job_body(workers=workers, elastic={"minWorkers": 2},
                                   template=GPU_TEMPLATE))
    cluster.job["status"] = {"groupWorkers": 2}
    cluster.nodes["node-1"] = gpu_node(gpus)
    _step(cluster)
    cluster.run()
    return cluster


@pytest.mark.parametrize("skew", [-120, 3600], ids=["scheduler behind", "scheduler ahead"])
def test_the_shrink_waits_on_the_operators_clock_whatever_the_schedulers(skew: float) -> None:
    """The refusal's own time is the scheduler's: 120 s behind, the group shrank at once; an
    hour ahead, it waited an hour."""
    cluster = elastic_cluster(None)
    _step(cluster)
    cluster.run(0, 1)
    refused(cluster, 2, skew)
    seen_at = cluster.now
    _step(cluster, 59)
    assert cluster.status["refusedSince"].replace("Z", "+00:00") == seen_at.isoformat()
    assert cluster.status["groupGeneration"] == 0
    _step(cluster, 1)  # 60 s since the operator saw it refused
    assert (cluster.status["groupGeneration"], cluster.status["groupWorkers"]) == (1, 2)
    assert cluster.status.get("refusedSince") is None  # the new group's own wait starts anew


def test_a_shrunk_group_grows_back_once_room_for_more_has_lasted() -> None:
    cluster = shrunk_to_2(3, 2)  # room for 2: the group's own
    _step(cluster)
    assert cluster.status["phase"] == "Running" and cluster.status.get("roomSince") is None
    cluster.nodes["node-1"] = gpu_node(3)  # a GPU freed
    _step(cluster)
    assert cluster.status["roomWorkers"] == 3 and cluster.status["roomSince"]
    _step(cluster, 119)
    assert cluster.status["groupGeneration"] == 0
    _step(cluster, 2)
    status = cluster.status
    assert (status["groupGeneration"], status.get("groupWorkers"), status["resizes"]) == \
        (1, None, 1)
    assert cluster.events[-1][1] == "Grew"
    assert cluster.events[-1][2].endswith("growing from 2 to 3 of 3 "
                                          "(workers each node holds: node-1 3)")


def test_room_that_comes_and_goes_grows_nothing() -> None:
    cluster = shrunk_to_2(3, 3)
    _step(cluster, 100)
    cluster.nodes["node-1"] = gpu_node(2)  # taken again before growAfter
    _step(cluster, 30)
    cluster.nodes["node-1"] = gpu_node(3)
    _step(cluster, 100)
    assert cluster.status["groupGeneration"] == 0 and cluster.status.get("resizes", 0) == 0


def test_what_other_tenants_hold_on_the_node_keeps_a_shrunk_group_small() -> None:
    """The operator's cache has its own jobs' pods only: the room counts the node's pods as
    the API lists them, and an operator that may not list them never grows blind."""
    cluster = FakeCluster(job_body(workers=3, elastic={"minWorkers": 2}, template=GPU_TEMPLATE))
    cluster.job["status"] = {"groupWorkers": 2}
    cluster.nodes["node-1"] = gpu_node(4)
    hog = pod("node-1", gpus=2)
    cluster.others.append(hog)
    _step(cluster)
    cluster.run()
    _step(cluster, 500)
    assert cluster.status["roomWorkers"] == 2 and cluster.status.get("roomSince") is None
    cluster.others.remove(hog)
    cluster.pods_on_node_forbidden = True
    _step(cluster, 500)
    assert cluster.status.get("roomWorkers", 0) == 0 and cluster.status.get("resizes", 0) == 0
    cluster.pods_on_node_forbidden = False
    _step(cluster)
    _step(cluster, 120)
    assert cluster.status["resizes"] == 1 and cluster.events[-1][1] == "Grew"


def test_a_resize_whose_status_write_failed_is_decided_once() -> None:
    """The new size and generation go in one status write: lost (a conflict, the operator
    killed), the next pass sees the same refusal and decides the same, once."""
    cluster = elastic_cluster(None)
    _step(cluster)
    cluster.run(0, 1)
    refused(cluster, 2)
    cluster.fail_status_writes = 1
    with pytest.raises(RuntimeError):
        _step(cluster, 61)
    assert cluster.status.get("resizes", 0) == 0
    _step(cluster)
    assert (cluster.status["resizes"], cluster.status["groupGeneration"]) == (1, 1)
    assert [e[1] for e in cluster.events].count("Shrunk") == 1


def test_a_shrunk_group_restarts_in_place_at_its_size() -> None:
    from tests.unit.test_in_place import held, on_kubelet, start_in_place

    cluster = on_kubelet(FakeCluster(job_body(workers=3, elastic={"minWorkers": 2},
                                              restartPolicy={"mode": "InPlace",
                                                             "backoffSeconds": 0})))
    cluster.job["status"] = {"groupWorkers": 2}
    start_in_place(cluster)
    assert len(cluster.pods) == 2
    held(cluster, 1)
    _step(cluster)
    assert (cluster.status["restartPath"], cluster.status["restarts"]) == ("InPlace", 1)
    assert cluster.status["groupWorkers"] == 2 and len(cluster.pods) == 2


def test_a_job_edited_while_shrunk_keeps_its_group_and_grows_to_the_new_size() -> None:
    """spec.workers 3 -> 4 while shrunk to 2: the running group stays (its TF_CONFIG is
    still right), the size reads 2/4, and room for 4 grows it to 4."""
    cluster = shrunk_to_2(3, 2)
    _step(cluster)
    cluster.set_spec(workers=4)
    _step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status["size"], len(cluster.pods)) == (0, "2/4", 2)
    cluster.nodes["node-1"] = gpu_node(4)
    _step(cluster)
    _step(cluster, 121)
    assert cluster.events[-1][1] == "Grew" and "growing from 2 to 4 of 4" in cluster.events[-1][2]


def test_a_job_edited_to_more_min_workers_than_its_shrunk_size_grows_to_them_at_once() -> None:
    """minWorkers 2 -> 3 while shrunk to 2 and short of GPUs: the next generation has 3 (the
    job asked never to train with fewer); the one it cannot place waits, and nothing shrinks
    it below 3 again."""
    cluster = shrunk_to_2(4, 2)
    _step(cluster)
    cluster.set_spec(elastic={"minWorkers": 3})
    _step(cluster)
    status = cluster.status
    assert (status["groupGeneration"], status["groupWorkers"], status["resizes"]) == (1, 3, 1)
    assert cluster.events[-1][1] == "Grew"
    assert "minWorkers is 3, more than the 2 the group has: growing from 2 to 3 of 4" in \
        cluster.events[-1][2]
    _step(cluster)
    cluster.finish_deletions()
    _step(cluster)
    assert sorted(cluster.pods) == [f"demo-worker-{i}" for i in range(3)]
    cluster.run(0, 1)
    refused(cluster, 2)
    _step(cluster, 600)
    assert (cluster.status["groupGeneration"], cluster.status["resizes"]) == (1, 1)
