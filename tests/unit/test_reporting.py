"""Reconcile passes given polled progress: status.progress, hang restarts, stragglers, targets,
and the ProgressReporting condition."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from multiworker.clients import metrics
from multiworker.decide.progress import (
    BadReport,
    GroupHealth,
    Report,
    Targets,
    parse_report,
    track,
)
from multiworker.decide.stragglers import STRAGGLER_POLLS, mark_stragglers
from multiworker.reconcile.reconcile import Outcome, reconcile

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.fake_cluster import FakeCluster
from tests.unit.test_progress import body, raw, report


@pytest.fixture(autouse=True)
def _forget_the_job_in_metrics() -> Iterator[None]:
    yield
    metrics.set_job_phase(NAMESPACE, "demo", None)


def step(cluster: FakeCluster, health: GroupHealth | None = None, seconds: float = 1) -> Outcome:
    cluster.now += timedelta(seconds=seconds)
    return reconcile(cluster, NAMESPACE, "demo", cluster.now, health)


def started(workers: int = 2, **spec: Any) -> tuple[FakeCluster, Targets]:
    """A running group, and the targets the pass hands the poller."""
    cluster = FakeCluster(job_body(workers=workers, **spec))
    step(cluster)
    cluster.run()
    outcome = step(cluster)
    assert cluster.status["phase"] == "Running" and outcome.targets is not None
    return cluster, outcome.targets


def poll(cluster: FakeCluster, targets: Targets, health: GroupHealth | None,
         answers: dict[int, Report | BadReport | None], seconds: float = 3) -> GroupHealth:
    cluster.now += timedelta(seconds=seconds)
    return mark_stragglers(track(health, targets, answers, cluster.now),
                           targets.straggler_threshold)


@pytest.mark.parametrize(("spec_health", "training"), [
    ({}, (0,)),  # only status.progress is wanted once training: the chief's report
    ({"progressTimeoutSeconds": 30}, (0, 1, 2)),  # hang detection compares every worker
    ({"stragglerThreshold": 0.5}, (0, 1, 2)),  # so does straggler detection
])
def test_every_worker_is_polled_while_starting_then_those_some_detection_compares(
    spec_health: dict[str, Any], training: tuple[int, ...]
) -> None:
    cluster, targets = started(workers=3, health=spec_health)
    assert tuple(i for i, _ in targets.workers) == (0, 1, 2)  # any may report a lost peer
    health = poll(cluster, targets, None, {i: report(i, step=0, phase="waiting-for-peers")
                                           for i in range(3)})
    outcome = step(cluster, health)
    assert outcome.targets is not None and len(outcome.targets.workers) == 3
    health = poll(cluster, targets, health, {i: report(i, step=5) for i in range(3)})
    outcome = step(cluster, health)
    assert outcome.targets is not None
    assert tuple(i for i, _ in outcome.targets.workers) == training


def test_targets_are_the_running_workers_of_the_current_group() -> None:
    cluster, targets = started(health={"progressTimeoutSeconds": 30, "progressPort": 9000})
    assert targets == Targets(generation=0, port=9000, all_running=True, progress_timeout=30,
                              workers=((0, "10.88.0.10"), (1, "10.88.0.11")))
    cluster.exit(1, 1)
    assert step(cluster).targets is None  # the pass restarted the group: nothing to poll
    cluster = FakeCluster(job_body(workers=2))
    step(cluster)
    cluster.run(0)
    targets = step(cluster).targets
    assert targets is not None and targets.workers == ((0, "10.88.0.10"),)
    assert not targets.all_running


def test_progress_is_recorded_and_a_resume_announced_once() -> None:
    cluster, targets = started()
    health = poll(cluster, targets, None, {0: report(step=63, restoredFromStep=40),
                                           1: report(1, step=63)})
    step(cluster, health)
    progress = cluster.status["progress"]
    assert (progress["step"], progress["resumedFromStep"], progress["lastCheckpointStep"]) == (
        63, 40, 10)
    assert progress["stepsPerSecond"] == 2.5 and progress["updatedAt"] == "2026-01-01T12:00:00.500Z"
    resumed = [e for e in cluster.events if e[1] == "TrainingResumed"]
    assert resumed == [("Normal", "TrainingResumed",
                        "generation 0 resumed training from the checkpoint of step 40")]
    step(cluster, health)
    assert len([e for e in cluster.events if e[1] == "TrainingResumed"]) == 1


def test_a_resume_from_a_survivors_save_says_whose() -> None:
    cluster, targets = started()
    health = poll(cluster, targets, None, {
        0: report(step=47, restoredFromStep=46, restoredFrom="survivor worker-2, generation 0"),
        1: report(1, step=47)})
    step(cluster, health)
    progress = cluster.status["progress"]
    assert (progress["resumedFromStep"], progress["resumedFrom"]) == \
        (46, "survivor worker-2, generation 0")
    resumed = [e for e in cluster.events if e[1] == "TrainingResumed"]
    assert resumed == [("Normal", "TrainingResumed",
                        ("generation 0 resumed training at step 46, saved by survivor "
                         "worker-2, generation 0 when a peer failed"))]


def test_what_a_failure_cost_is_counted_once_the_next_group_resumes() -> None:
    """The chief last reported step 40; worker-1 saved its replica at step 47 when its peer
    died (its termination message says so). The next group resumes at 47: nothing lost."""
    cluster, targets = started()
    health = poll(cluster, targets, None, {0: report(step=40), 1: report(1, step=40)})
    step(cluster, health)
    cluster.exit(0, 137, "OOMKilled")
    cluster.exit(1, 4, message="collective aborted; saved this survivor's state at step 47")
    for _ in range(4):
        step(cluster, seconds=3)
    failure = cluster.status["lastFailure"]
    assert (failure["worker"], failure["lastStep"]) == (0, 47), cluster.events
    cluster.finish_deletions()
    step(cluster)
    cluster.run()
    outcome = step(cluster)
    assert outcome.targets is not None and outcome.targets.generation == 1
    before = metrics.STEPS_LOST._value.get()
    resumed = parse_report(body(raw(0, 48, generation=1, restoredFromStep=47,
                                    restoredFrom="survivor worker-1, generation 0")), 0, 1)
    assert isinstance(resumed, Report)
    health = poll(cluster, outcome.targets, None, {0: resumed})
    step(cluster, health)
    assert cluster.status["lastFailure"]["stepsLost"] == 0
    assert metrics.STEPS_LOST._value.get() == before
    events = [m for _, r, m in cluster.events if r == "TrainingResumed"]
    assert events[-1].endswith("; 0 steps lost (the last step done was 47)"), events


def test_the_history_keeps_each_generation_its_end_and_its_cost() -> None:
    """status.history: generation 0 created, ended by the OOM kill at step 47; generation 1
    recreated, resumed at 47 (nothing lost), ended by the chief's success."""
    cluster, _ = started()
    assert [(r["generation"], r["path"], r["workers"]) for r in cluster.status["history"]] == \
        [(0, "Created", 2)]
    assert cluster.status["history"][0]["running"] is not None
    cluster.exit(0, 137, "OOMKilled")
    cluster.exit(1, 4, message="collective aborted; saved this survivor's state at step 47")
    for _ in range(4):
        step(cluster, seconds=3)
    cluster.finish_deletions()
    step(cluster)
    cluster.run()
    outcome = step(cluster)
    assert outcome.targets is not None
    resumed = parse_report(body(raw(0, 48, generation=1, restoredFromStep=47,
                                    restoredFrom="survivor worker-1, generation 0")), 0, 1)
    step(cluster, poll(cluster, outcome.targets, None, {0: resumed}))
    cluster.exit(0, 0, "Completed")
    step(cluster)
    first, second = cluster.status["history"]
    assert (first["reason"], first["lastStep"], first["stepsLost"], first["resumedFromStep"]) \
        == ("OOMKilled", 47, 0, None), first
    assert first["ended"] is not None and "worker-0" in first["message"]
    assert (second["generation"], second["path"], second["resumedFromStep"]) == \
        (1, "Recreate", 47)
    assert second["started"] == first["ended"] and second["running"] is not None
    assert (second["reason"], second.get("stepsLost")) == ("ChiefSucceeded", None), second


def stalled(cluster: FakeCluster, targets: Targets) -> GroupHealth:
    """worker-1 stops answering after step 63; worker-0 waits at 63 for 30s."""
    health = poll(cluster, targets, None, {0: report(step=63), 1: report(1, step=63)})
    for _ in range(10):
        health = poll(cluster, targets, health, {0: report(step=63), 1: None})
    return health


def test_a_hang_restarts_the_group_blaming_the_worker_that_stopped_first() -> None:
    cluster, targets = started(health={"progressTimeoutSeconds": 20})
    health = stalled(cluster, targets)
    step(cluster, health)
    status = cluster.status
    assert (status["phase"], status["restarts"], status["groupGeneration"]) == (
        "Restarting", 1, 1)
    failure = status["lastFailure"]
    assert (failure["worker"], failure["reason"], failure["action"]) == (
        1, "ProgressStalled", "RestartGroup")
    assert status["progress"]["resumedFromStep"] is None  # the next group has not restored
    assert cluster.events[-1] == (
        "Warning", "ProgressStalled",
        ("restarting group: no progress for 30s: worker-1 stopped first at step 63 "
         "(unreachable since 12:00:08); worker-0 at step 63 (answering); restart 1 of 3 in 1s"))
    step(cluster, health)  # deletes the old group (gracefully: they may checkpoint)
    assert all(p["metadata"]["deletionGracePeriodSeconds"] == 30 for p in cluster.pods.values())
    cluster.finish_deletions()
    step(cluster, health, seconds=2)
    cluster.run()
    step(cluster, health)  # the old generation's health no longer counts
    status = cluster.status
    assert (status["phase"], status["restarts"]) == ("Running", 1)
    assert status["lastRecoverySeconds"] > 0


def test_a_hang_with_no_restarts_left_fails_the_job() -> None:
    cluster, targets = started(health={"progressTimeoutSeconds": 20},
                               restartPolicy={"maxRestarts": 0})
    step(cluster, stalled(cluster, targets))
    status = cluster.status
    assert status["phase"] == "Failed" and status["lastFailure"]["reason"] == "ProgressStalled"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RestartLimitExceeded"
    assert failed["message"].startswith("no progress for 30s: worker-1 stopped first")


def test_no_hang_rule_without_a_timeout() -> None:
    cluster, targets = started()
    step(cluster, stalled(cluster, targets))
    assert cluster.status["phase"] == "Running"


def test_stragglers_are_reported_and_cleared_with_events() -> None:
    cluster, targets = started(workers=3, health={"stragglerThreshold": 0.5})
    health = None
    for n in range(STRAGGLER_POLLS):
        health = poll(cluster, targets, health, {
            i: report(i, step=n + 1, stepsPerSecond=rate) for i, rate in enumerate([4, 1, 4])})
    step(cluster, health)
    assert cluster.status["stragglers"] == [1] and cluster.status["phase"] == "Running"
    assert cluster.events[-1][:2] == ("Warning", "Straggler")
    assert "worker-1 is straggling: 1 steps/s" in cluster.events[-1][2]
    for n in range(STRAGGLER_POLLS):
        health = poll(cluster, targets, health, {
            i: report(i, step=n + 9, stepsPerSecond=4) for i in range(3)})
    step(cluster, health)
    assert "stragglers" not in cluster.status  # absent when there are none
    assert cluster.events[-1][:2] == ("Normal", "StragglerRecovered")


def test_a_dropped_peer_port_is_reported_early_and_cleared_once_connected() -> None:
    cluster, targets = started()
    waiting = report(1, phase="waiting-for-peers", step=0, peers=[{
        "worker": 0, "endpoint": "tensorflow", "address": "demo-worker-0.demo.ml.svc:2222",
        "state": "dropped", "detail": "no answer after 3 attempts: packets are dropped",
        "since": 1767268800.0}])
    health = poll(cluster, targets, None, {0: report(phase="waiting-for-peers", step=0),
                                           1: waiting})
    step(cluster, health)
    peers = next(c for c in cluster.status["conditions"] if c["type"] == "PeersReachable")
    assert (peers["status"], peers["reason"]) == ("False", "PortBlocked")
    assert peers["message"].startswith(
        "worker-1 cannot reach worker-0 at demo-worker-0.demo.ml.svc:2222 (tensorflow port): "
        "no answer after 3 attempts")
    assert [e[:2] for e in cluster.events if e[1] == "PortBlocked"] == [("Warning", "PortBlocked")]
    step(cluster, health)
    assert len([e for e in cluster.events if e[1] == "PortBlocked"]) == 1  # once
    health = poll(cluster, targets, health, {0: report(step=1), 1: report(1, step=1)})
    step(cluster, health)
    peers = next(c for c in cluster.status["conditions"] if c["type"] == "PeersReachable")
    assert (peers["status"], peers["reason"]) == ("True", "PeersConnected")


def test_progress_reporting_condition_names_bad_reports() -> None:
    cluster, targets = started(health={"progressTimeoutSeconds": 30})
    health = poll(cluster, targets, None, {0: report(step=5), 1: BadReport("larger than 64 KiB")})
    step(cluster, health)
    status = cluster.status
    reporting = next(c for c in status["conditions"] if c["type"] == "ProgressReporting")
    assert (reporting["status"], reporting["reason"]) == ("False", "BadProgressReports")
    assert "worker-1 answered GET /progress with something that is not its report " \
        "(larger than 64 KiB)" in reporting["message"]
    assert status["badProgressReports"] == 1
