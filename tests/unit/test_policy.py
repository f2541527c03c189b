from __future__ import annotations

from typing import Any

import pytest
from multiworker.api.status import FailureRecord, JobStatus
from multiworker.decide.lost_nodes import lost_node_deadline
from multiworker.decide.nodes import (
    NodeTrouble,
    combined,
    heartbeat_trouble,
    node_trouble,
)
from multiworker.decide.observe import Classified, ObservedGroup, observe_group
from multiworker.decide.policy import (
    NO_ACTION,
    Action,
    ActionKind,
    backoff_seconds,
    broken_group_grace,
    failure_action,
    product_full_action,
    refused_start_action,
    replacement_action,
    success_action,
    survivor_save_grace,
)
from multiworker.decide.progress import GroupHealth, WorkerTrack
from multiworker.decide.startup import startup_deadline
from multiworker.decide.workers import WorkerPhase, WorkerState

from tests.unit.builders import JOB, JOB_UID, PodBuilder, at, make_spec, stamp


def group(*pods: PodBuilder, workers: int = 3) -> ObservedGroup:
    built = [p.build() for p in pods]
    return observe_group(built, job=JOB, job_uid=JOB_UID, workers=workers, generation=0,
                         container="tensorflow")


def running(*indexes: int) -> list[PodBuilder]:
    return [PodBuilder(i).running() for i in indexes]


FAIL_FAST = {"onExitCodes": [{"action": "FailJob", "values": [2]}]}


@pytest.mark.parametrize(
    ("pods", "restarts", "policy", "kind", "reason", "message"),
    [
        pytest.param(
            [*running(0, 2), PodBuilder(1).exited(1)], 0, {},
            ActionKind.RESTART_GROUP, "WorkerFailed",
            "restarting group: worker-1 exited 1 (Error); restart 1 of 3 in 1s",
            id="non-zero exit restarts and spends one restart",
        ),
        pytest.param(
            [*running(0, 1), PodBuilder(2).exited(137, "OOMKilled")], 2,
            {"maxRestarts": 5, "backoffSeconds": 5},
            ActionKind.RESTART_GROUP, "WorkerFailed",
            "restarting group: worker-2 exited 137 (OOMKilled); restart 3 of 5 in 20s",
            id="backoff doubles with restarts spent",
        ),
        pytest.param(
            [*running(0, 2), PodBuilder(1).exited(2, message="Traceback\nValueError: bad")], 0,
            FAIL_FAST, ActionKind.FAIL_JOB, "ExitCodeFailsJob",
            "worker-1 exited 2 (Error: ValueError: bad); exit code 2 fails the job "
            "(spec.restartPolicy)",
            id="fail-fast exit code",
        ),
        pytest.param(
            [*running(0, 2), PodBuilder(1).exited(1)], 3, {},
            ActionKind.FAIL_JOB, "RestartLimitExceeded",
            "worker-1 exited 1 (Error); restart limit reached (3 of 3 restarts spent)",
            id="budget exhausted",
        ),
        pytest.param(
            [*running(0, 2), PodBuilder(1).evicted()], 3, {},
            ActionKind.RESTART_GROUP_UNCOUNTED, "WorkerDisrupted",
            "restarting group: worker-1 was evicted: The node was low on resource: memory; "
            "a disruption, not counted as a restart (disruption 1 of 20, 0 of 3 restarts "
            "left); starting now",
            id="eviction does not spend the budget even when it is exhausted",
        ),
        pytest.param(
            [*running(0, 2), PodBuilder(1).running().deleted(requested=5)], 1, {},
            ActionKind.RESTART_GROUP_UNCOUNTED, "WorkerDisrupted",
            "restarting group: worker-1 was deleted: the pod was deleted; a disruption, "
            "not counted as a restart (disruption 1 of 20, 2 of 3 restarts left); starting now",
            id="deleted pod",
        ),
        pytest.param(
            [*running(1, 2), PodBuilder(0).running().disruption_target("PreemptionByScheduler")],
            0, {}, ActionKind.RESTART_GROUP_UNCOUNTED, "WorkerDisrupted", None, id="preempted",
        ),
        pytest.param(
            [*running(1, 2), PodBuilder(0).running().disruption_target("DeletionByTaintManager")],
            0, {}, ActionKind.RESTART_GROUP_UNCOUNTED, "WorkerDisrupted", None, id="node lost",
        ),
        pytest.param(
            running(0, 1, 2), 0, {}, ActionKind.NONE, "", "", id="healthy group",
        ),
    ],
)
def test_failure_policy(
    pods: list[PodBuilder], restarts: int, policy: dict[str, Any], kind: ActionKind,
    reason: str, message: str | None,
) -> None:
    spec = make_spec(restartPolicy=policy)
    action = failure_action(spec, JobStatus(restarts=restarts), group(*pods),
                            group_started=True, now=at(60))
    assert (action.kind, action.reason) == (kind, reason)
    if message is not None:
        assert action.message == message


def test_missing_pod_is_a_disruption_only_once_the_group_exists() -> None:
    spec = make_spec()
    partial = group(*running(0, 1))
    assert failure_action(spec, JobStatus(), partial, group_started=False, now=at(1)) is NO_ACTION
    action = failure_action(spec, JobStatus(), partial, group_started=True, now=at(1))
    assert action.kind is ActionKind.RESTART_GROUP_UNCOUNTED
    assert "worker-2 disappeared" in action.message


@pytest.mark.parametrize(
    ("pods", "culprit"),
    [
        pytest.param([PodBuilder(0).exited(4, finished=9), PodBuilder(2).exited(137, "OOMKilled",
                      finished=10), PodBuilder(1).exited(3, finished=9)], 2,
                     id="peer-failure exits are symptoms, not causes"),
        pytest.param([PodBuilder(1).exited(1, finished=20), PodBuilder(2).exited(1, finished=10),
                      PodBuilder(0).running()], 2, id="the first to fail is blamed"),
        pytest.param([PodBuilder(0).exited(1, finished=8), PodBuilder(1).running()
                      .deleted(requested=5), PodBuilder(2).running()], 1,
                     id="a deletion before the crash explains it"),
        pytest.param([PodBuilder(0).exited(4, finished=9), PodBuilder(1).exited(4, finished=8),
                      PodBuilder(2).running()], 1, id="only symptoms: the earliest"),
    ],
)
def test_culprit(pods: list[PodBuilder], culprit: int) -> None:
    action = failure_action(make_spec(), JobStatus(), group(*pods), group_started=True, now=at(60))
    assert action.culprit is not None and action.culprit.worker == culprit


UNSCHEDULABLE = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def test_startup_timeout_fails_with_the_schedulers_words() -> None:
    spec = make_spec(health={"startupTimeoutSeconds": 300})
    pods = group(*running(0, 1), PodBuilder(2).created(0).unschedulable(UNSCHEDULABLE))
    assert failure_action(spec, JobStatus(), pods, group_started=True, now=at(299)) is NO_ACTION
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(300))
    assert (action.kind, action.reason) == (ActionKind.FAIL_JOB, "StartupTimeout")
    assert action.message == f"worker-2 could not start within 300s (Unschedulable: {UNSCHEDULABLE})"
    assert startup_deadline(spec, pods) == at(300)


def test_startup_timeout_can_be_turned_off() -> None:
    spec = make_spec(health={"startupTimeoutSeconds": None})
    pods = group(PodBuilder(0).waiting("ImagePullBackOff"), *running(1, 2))
    assert failure_action(spec, JobStatus(), pods, group_started=True, now=at(9999)) is NO_ACTION
    assert startup_deadline(spec, pods) is None


def test_invalid_image_name_fails_at_once() -> None:
    pods = group(PodBuilder(0).waiting("InvalidImageName", "bad ref"), *running(1, 2))
    action = failure_action(make_spec(), JobStatus(), pods, group_started=True, now=at(1))
    assert action.kind is ActionKind.FAIL_JOB
    assert "waiting will not help (InvalidImageName: bad ref)" in action.message


@pytest.mark.parametrize(
    ("policy", "pods", "kind", "reason"),
    [
        ("ChiefSucceeded", [PodBuilder(0).exited(0), *running(1, 2)], ActionKind.SUCCEED,
         "ChiefSucceeded"),
        ("ChiefSucceeded", [PodBuilder(0).exited(0), PodBuilder(1).exited(4),
                            PodBuilder(2).exited(0)], ActionKind.SUCCEED, "ChiefSucceeded"),
        ("ChiefSucceeded", [PodBuilder(1).exited(0), *running(0, 2)], ActionKind.NONE, ""),
        ("AllWorkersSucceeded", [PodBuilder(0).exited(0), *running(1, 2)], ActionKind.NONE, ""),
        ("AllWorkersSucceeded", [PodBuilder(i).exited(0) for i in range(3)],
         ActionKind.SUCCEED, "AllWorkersSucceeded"),
    ],
)
def test_success_policy(
    policy: str, pods: list[PodBuilder], kind: ActionKind, reason: str
) -> None:
    action = success_action(make_spec(successPolicy=policy), group(*pods))
    assert (action.kind, action.reason) == (kind, reason)


@pytest.mark.parametrize(
    ("base", "cap", "expected"),
    [(10, 300, [10, 20, 40, 80, 160, 300, 300]), (0, 300, [0] * 7), (7, 7, [7] * 7)],
)
def test_backoff(base: int, cap: int, expected: list[int]) -> None:
    assert [backoff_seconds(base, cap, spent) for spent in range(7)] == expected
    assert backoff_seconds(base, cap, 10_000) == min(cap, base * 2**32)


# --- collateral exits, disruption budget, own-usage evictions, lost nodes, refusals ---


def test_a_symptom_waits_briefly_for_the_failure_that_caused_it() -> None:
    """worker-2 exits 4 (collective aborted) a moment before worker-1's own death shows."""
    spec = make_spec()
    symptom_only = group(PodBuilder(0).running(), PodBuilder(1).running(),
                         PodBuilder(2).exited(4, finished=10))
    wait = failure_action(spec, JobStatus(), symptom_only, group_started=True, now=at(12))
    assert (wait.kind, wait.delay_seconds) == (ActionKind.WAIT, 3)
    both = group(PodBuilder(0).running(), PodBuilder(1).exited(137, finished=11),
                 PodBuilder(2).exited(4, finished=10))
    action = failure_action(spec, JobStatus(), both, group_started=True, now=at(13))
    assert action.culprit is not None and action.culprit.worker == 1
    alone = failure_action(spec, JobStatus(), symptom_only, group_started=True, now=at(15))
    assert alone.kind is ActionKind.RESTART_GROUP and alone.culprit is not None
    assert alone.culprit.worker == 2


@pytest.mark.parametrize(("renewed_b", "now", "kind", "delay"), [
    # node b renewed after the symptom: it is up, so the symptom is the job's (after 5 s;
    # a counted restart backs off 1 s)
    (11, 15, ActionKind.RESTART_GROUP, 1),
    # b not seen renewing since the symptom: given one renewal interval and a margin (to 23)
    (5, 15, ActionKind.WAIT, 8),
    # b silent since 5, trouble from before the symptom: its loss broke the group
    (5, 18, ActionKind.RESTART_GROUP_UNCOUNTED, 0),
    # Leases not watched (no renewals known): as before, the symptom after 5 s
    (None, 15, ActionKind.RESTART_GROUP, 1),
])
def test_a_symptom_is_a_disruption_when_a_peers_node_had_stopped_renewing_its_lease(
    renewed_b: int | None, now: int, kind: ActionKind, delay: float
) -> None:
    """A node that powers off resets its workers' connections at once: the peers on healthy
    nodes exit 4 (collective aborted) seconds before the dead node's Lease is missed, and
    the pods on it never report anything. Blaming the symptom would spend a restart."""
    spec = make_spec()
    pods = group(PodBuilder(0).running().on_node("a"), PodBuilder(1).running().on_node("b"),
                 PodBuilder(2).exited(4, finished=10).on_node("a"))
    renewals = {"a": at(now - 1)}
    troubles = {}
    if renewed_b is not None:
        renewals["b"] = at(renewed_b)
        trouble = heartbeat_trouble("b", now - renewed_b, at(now))
        troubles = {"b": trouble} if trouble else {}
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(now),
                            troubles=troubles, renewals=renewals)
    assert (action.kind, action.delay_seconds) == (kind, delay), action
    if kind is ActionKind.RESTART_GROUP_UNCOUNTED:
        assert action.culprit is not None and action.culprit.worker == 1
        assert "worker-1 lost its node: node b last renewed its Lease at 12:00:05" in \
            action.message


def _symptom_pass(classified: Classified, finished: float, now: float,
                  renewed_b: float) -> Action:
    """worker-2's collective aborts (exit 4) on node a, whose clock reports its end at
    `finished`; node b last renewed its Lease at `renewed_b` (the operator's clock)."""
    pods = [PodBuilder(0).running().on_node("a").build(),
            PodBuilder(1).running().on_node("b").build(),
            PodBuilder(2).exited(4, finished=finished).on_node("a").build()]
    observed = observe_group(pods, job=JOB, job_uid=JOB_UID, workers=3, generation=0,
                             container="tensorflow", classified=classified, now=at(now))
    trouble = heartbeat_trouble("b", now - renewed_b, at(now))
    return failure_action(make_spec(), JobStatus(), observed, group_started=True, now=at(now),
                          troubles={"b": trouble} if trouble else {},
                          renewals={"a": at(now - 1), "b": at(renewed_b)})


def test_a_node_whose_clock_is_slow_does_not_turn_a_peers_node_loss_into_a_counted_restart(
) -> None:
    """Node a runs 7 s slow: worker-2's exit at 10 reads 3. Node b stopped renewing at 5 and
    the operator first saw the exit at 10.5: b's silence began before it, so b's loss broke
    the group — not the symptom, which a comparison with the kubelet's 3 would blame."""
    classified = Classified()
    first = _symptom_pass(classified, finished=3, now=10.5, renewed_b=5)
    assert first.kind is ActionKind.WAIT
    later = _symptom_pass(classified, finished=3, now=18, renewed_b=5)
    assert later.kind is ActionKind.RESTART_GROUP_UNCOUNTED, later
    assert later.culprit is not None and later.culprit.worker == 1


@pytest.mark.parametrize("memory", [True, False])
def test_a_node_whose_clock_is_an_hour_fast_does_not_make_a_symptom_wait_an_hour(
    memory: bool
) -> None:
    """Node a runs an hour fast: worker-2's exit at 10 reads 3610. The symptom waits its
    5 s window from when the operator saw it, whatever the node's clock says (without a
    memory of first sightings: from no later than now)."""
    classified = Classified() if memory else None
    def action(now: float) -> Action:
        pods = [PodBuilder(0).running().build(), PodBuilder(1).running().build(),
                PodBuilder(2).exited(4, finished=3610).build()]
        observed = observe_group(pods, job=JOB, job_uid=JOB_UID, workers=3, generation=0,
                                 container="tensorflow", classified=classified, now=at(now))
        return failure_action(make_spec(), JobStatus(), observed, group_started=True,
                              now=at(now))
    wait = action(10)
    assert (wait.kind, wait.delay_seconds) == (ActionKind.WAIT, 5)
    if memory:
        restart = action(15)
        assert restart.kind is ActionKind.RESTART_GROUP and restart.culprit is not None
        assert restart.culprit.worker == 2


GPUS_SHORT = "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) didn't match"


@pytest.mark.parametrize(("message", "wanted", "free", "kind"), [
    (GPUS_SHORT, None, {"T4": 0, "A100": 3}, ActionKind.REPLACE_GROUP),  # A100 holds it whole
    (GPUS_SHORT, None, {"T4": 0, "A100": 2}, ActionKind.NONE),  # A100 holds only part of it
    (GPUS_SHORT, None, {"T4": 3, "A100": 3}, ActionKind.NONE),  # T4 frees up: stay
    (GPUS_SHORT, "T4", {"T4": 0, "A100": 3}, ActionKind.NONE),  # the spec names T4
    ("0/4 nodes are available: 4 Insufficient memory", None, {"T4": 0, "A100": 3},
     ActionKind.NONE),  # not short of GPUs: another product would not help
])
def test_a_group_refused_for_gpus_moves_to_a_product_with_room(
    message: str, wanted: str | None, free: dict[str, int], kind: ActionKind
) -> None:
    pods = [PodBuilder(0).running(), PodBuilder(1).running(), PodBuilder(2)]
    observed = group(*pods)
    pending = observed.workers[2]
    observed = ObservedGroup(0, (*observed.workers[:2], WorkerState(
        2, WorkerPhase.PENDING, pending.pod, reason="Unschedulable", message=message)))
    action = product_full_action(observed, "T4", wanted, free)
    assert action.kind is kind
    if kind is ActionKind.REPLACE_GROUP:
        assert action.message == ("worker-2 cannot be scheduled on T4 (other pods hold its "
                                  "GPUs) and A100 has room for all 3 workers: placing the "
                                  "group again there")


@pytest.mark.parametrize(("reason", "code", "action", "generation", "own", "grace"), [
    ("Error", 1, "RestartGroup", 0, 30, 3),          # a trainer failed: the collective is broken
    ("Error", 1, "RestartGroup", 0, 1, 1),           # never longer than the pod's own
    ("NodeLost", None, "RestartGroupWithoutCounting", 0, 30, 3),   # a peer's node is gone
    ("Error", 1, "RestartGroup", 1, 30, None),       # another generation's failure
    ("Evicted", None, "RestartGroupWithoutCounting", 0, 30, None),  # peers may save together
    ("Error", 143, "RestartGroupWithoutCounting", 0, 30, None),     # onExitCodes: a disruption
    ("ProgressStalled", None, "RestartGroup", 0, 30, None),  # a shared stall may still save
])
def test_a_group_that_ended_broken_is_deleted_with_a_short_grace_period(
    reason: str, code: int | None, action: str, generation: int, own: int, grace: int | None
) -> None:
    failure = FailureRecord(worker=1, generation=generation, reason=reason, exit_code=code,
                            message="", time=at(10), action=action)
    assert broken_group_grace(failure, 0, own) == grace
    assert broken_group_grace(None, 0, own) is None
    # Workers that save a copy on the way out (the runtime, with checkpoints) get what the
    # save needs (survivor_save_grace) instead of 3 s, more than their own if it needs it.
    saving = broken_group_grace(failure, 0, own, survivor_save=70)
    assert saving == (None if grace is None else 70)


@pytest.mark.parametrize(("expected", "rate", "cap", "grace"), [
    (None, 80.0, 300, 10),   # no figure (the chief had not stepped): the floor
    (0.05, 80.0, 300, 10),   # the test model: the floor
    (2.4, None, 300, 10),    # 2 x 2.4 + 5 = 9.8: the floor
    (10.0, None, 300, 25),   # twice the expected time and 5 s
    (10.0, 0.25, 300, 37),   # and three 4-second steps to tell the collective is stuck
    (60.2, 2.0, 300, 127),   # a 12 GB state over 200 MB/s: 1.5 + 120.4, rounded up, + 5
    (500.0, 1.0, 300, 300),  # never more than spec.restartPolicy.survivorSaveSeconds
    (None, None, 4, 4),      # nor the floor
    (3.0, 1.0, 0, 0),        # 0: the survivors get no time
])
def test_survivors_get_twice_the_expected_save_time_within_the_cap(
    expected: float | None, rate: float | None, cap: int, grace: int
) -> None:
    assert survivor_save_grace(expected, rate, cap) == grace


@pytest.mark.parametrize(("spent", "kind", "delay"), [
    (0, ActionKind.RESTART_GROUP_UNCOUNTED, 0),
    (1, ActionKind.RESTART_GROUP_UNCOUNTED, 1),
    (3, ActionKind.RESTART_GROUP_UNCOUNTED, 4),
    (4, ActionKind.FAIL_JOB, 0),
])
def test_disruptions_have_their_own_budget_and_back_off(
    spent: int, kind: ActionKind, delay: float,
) -> None:
    spec = make_spec(restartPolicy={"maxDisruptions": 4})
    pods = group(*running(0, 2), PodBuilder(1).running().deleted(requested=5))
    action = failure_action(spec, JobStatus(disruptions=spent), pods, group_started=True,
                            now=at(60))
    assert (action.kind, action.delay_seconds) == (kind, delay)
    if kind is ActionKind.FAIL_JOB:
        assert action.reason == "DisruptionLimitExceeded"
        assert "disruption limit reached (4 of 4 spent" in action.message


@pytest.mark.parametrize("message", [
    ("The node was low on resource: ephemeral-storage. Container tensorflow was using 20Gi, "
    "which exceeds its request of 0."),
    "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.",
])
def test_an_eviction_for_the_jobs_own_usage_spends_a_restart(message: str) -> None:
    pods = group(*running(0, 2), PodBuilder(1).running().evicted(message))
    action = failure_action(make_spec(), JobStatus(), pods, group_started=True, now=at(60))
    assert (action.kind, action.reason) == (ActionKind.RESTART_GROUP, "EvictedForResourceUsage")
    assert action.message.startswith(
        "restarting group: worker-1 was evicted for its own resource usage: ")


def test_a_worker_on_a_lost_node_restarts_the_group_as_a_disruption() -> None:
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"), PodBuilder(1).running().on_node("b"),
                 PodBuilder(2).running().on_node("a"))
    troubles = {"b": node_trouble("b", {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": stamp(30),
         "message": "Kubelet stopped posting node status."}]}})}
    assert troubles["b"] is not None
    early = failure_action(spec, JobStatus(), pods, group_started=True, now=at(49),
                           troubles=troubles)
    assert early is NO_ACTION
    assert lost_node_deadline(spec, pods, troubles) == at(50)
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(50),
                            troubles=troubles)
    assert (action.kind, action.reason) == (ActionKind.RESTART_GROUP_UNCOUNTED,
                                            "WorkerDisrupted")
    assert action.culprit is not None and action.culprit.reason == "NodeLost"
    assert action.message.startswith(
        "restarting group: worker-1 lost its node: node b is unreachable since 12:00:30 "
        "(Kubelet stopped posting node status.)")


UNREACHABLE_SINCE_30 = {"status": {"conditions": [
    {"type": "Ready", "status": "Unknown", "lastTransitionTime": stamp(30)}]}}


@pytest.mark.parametrize(("scheduled", "restarts"), [
    (20, True),   # bound before the node went away: lost with it
    (30, True),   # in the same second: counted as before (timestamps have whole seconds)
    (35, False),  # bound after: the scheduler saw the node back; our copy of it is older
])
def test_a_worker_bound_after_its_nodes_trouble_began_is_not_lost_to_it(
    scheduled: int, restarts: bool
) -> None:
    """A returning node: the pending worker is bound to it before the operator's node watch
    shows it Ready again; it must not read as lost (the second disruption seen on kind)."""
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"),
                 PodBuilder(1).running().scheduled(scheduled).on_node("b"), workers=2)
    troubles = {"b": node_trouble("b", UNREACHABLE_SINCE_30)}
    assert troubles["b"] is not None
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(60),
                            troubles=troubles)
    assert (action.kind is ActionKind.RESTART_GROUP_UNCOUNTED) is restarts, action
    assert (lost_node_deadline(spec, pods, troubles) is not None) is restarts


NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}  # no time


@pytest.mark.parametrize(("node", "reason", "since"), [
    (None, "Gone", None),
    ({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                           "timeAdded": stamp(3)}]}}, "Unreachable", 3),
    ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "NotReady", None),
    ({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, None, None),
    # Ready again: the taint the lifecycle controller has not removed yet dates the outage
    # that ended, not a current one.
    ({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                           "timeAdded": stamp(3)}]},
      "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, "Unreachable", None),
    # The NoSchedule taint carries no timeAdded: its age is unknown, never "long ago" ...
    ({"spec": {"taints": [NOT_READY_TAINT]}}, "NotReady", None),
    # ... and the Ready condition's transition time dates it when there is one.
    ({"spec": {"taints": [NOT_READY_TAINT]}, "status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": stamp(40)}]}}, "NotReady", 40),
])
def test_node_trouble(node: dict[str, Any] | None, reason: str | None, since: int | None) -> None:
    trouble = node_trouble("n1", node)
    assert (trouble.reason if trouble else None) == reason
    assert (trouble.since if trouble else None) == (at(since) if since is not None else None)


@pytest.mark.parametrize(("node", "now", "restarts"), [
    # NotReady for a second (a kubelet restart): the taint alone, no time -> never lost yet.
    ({"spec": {"taints": [NOT_READY_TAINT]}}, 45, False),
    ({"spec": {"taints": [NOT_READY_TAINT]}, "status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": stamp(40)}]}}, 45, False),
    ({"spec": {"taints": [NOT_READY_TAINT]}, "status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": stamp(40)}]}}, 60, True),
    (None, 45, True),  # the node object was deleted: its pods are gone with it
])
def test_a_node_counts_as_lost_only_after_node_lost_seconds_of_known_trouble(
    node: dict[str, Any] | None, now: int, restarts: bool,
) -> None:
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"), PodBuilder(1).running().on_node("b"),
                 PodBuilder(2).running().on_node("a"))
    trouble = node_trouble("b", node)
    assert trouble is not None
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(now),
                            troubles={"b": trouble})
    assert (action.kind is ActionKind.RESTART_GROUP_UNCOUNTED) is restarts, action


@pytest.mark.parametrize(("passing", "words"), [
    ("QuotaExceeded", "refused by quota"),
    ("ServiceAccountMissing", "their service account does not exist (yet)"),
])
def test_refused_pods_fail_unless_the_refusal_may_pass_which_waits_until_the_startup_timeout(
    passing: str, words: str,
) -> None:
    spec = make_spec(health={"startupTimeoutSeconds": 100})
    denied = refused_start_action(spec, JobStatus(), at(0), "violates PodSecurity", None)
    assert (denied.kind, denied.reason) == (ActionKind.FAIL_JOB, "PodRefused")
    first = refused_start_action(spec, JobStatus(), at(0), "the server's words", passing)
    assert (first.kind, first.reason, first.delay_seconds) == (ActionKind.WAIT, passing, 2)
    assert words in first.message and "the server's words" in first.message
    later = refused_start_action(spec, JobStatus(blocked_since=at(0)), at(40),
                                 "the server's words", passing)
    assert (later.kind, later.delay_seconds) == (ActionKind.WAIT, 20)
    over = refused_start_action(spec, JobStatus(blocked_since=at(0)), at(100),
                                "the server's words", passing)
    assert (over.kind, over.reason) == (ActionKind.FAIL_JOB, "StartupTimeout")
    assert f"{words} for 100s" in over.message


def test_image_skew_pins_the_next_group_to_the_chiefs_digest_once() -> None:
    chief, other = "reg/worker@sha256:aaa", "reg/worker@sha256:bbb"
    pods = [PodBuilder(0).running(), PodBuilder(1).running(), PodBuilder(2).running()]
    for pod, image in zip(pods, (chief, other, chief), strict=True):
        pod.pod["status"]["containerStatuses"][0]["imageID"] = image
    skewed = group(*pods)
    pin = failure_action(make_spec(), JobStatus(), skewed, group_started=True, now=at(60))
    assert (pin.kind, pin.reason, pin.pin_image) == (
        ActionKind.RESTART_GROUP_UNCOUNTED, "ImageSkew", chief)
    assert pin.culprit is not None and pin.culprit.worker == 1
    assert f"worker-0 {chief}, worker-1 {other}, worker-2 {chief}" in pin.message
    again = failure_action(make_spec(), JobStatus(pinned_image=chief), skewed,
                           group_started=True, now=at(60))
    assert (again.kind, again.reason) == (ActionKind.FAIL_JOB, "ImageSkew")
    fail = failure_action(make_spec(imageSkewPolicy="FailJob"), JobStatus(), skewed,
                          group_started=True, now=at(60))
    assert fail.kind is ActionKind.FAIL_JOB and "spec.imageSkewPolicy is FailJob" in fail.message


def test_an_image_without_a_registry_digest_cannot_be_pinned() -> None:
    pods = [PodBuilder(0).running(), PodBuilder(1).running()]
    for pod, image in zip(pods, ("sha256:aaa", "sha256:bbb"), strict=True):
        pod.pod["status"]["containerStatuses"][0]["imageID"] = image
    action = failure_action(make_spec(workers=2), JobStatus(), group(*pods, workers=2),
                            group_started=True, now=at(60))
    assert action.kind is ActionKind.FAIL_JOB
    assert "has no registry digest to pin to" in action.message


@pytest.mark.parametrize(("silence", "now", "restarts"), [
    (11, 41, False),  # one renewal late: not trouble yet (the kubelet renews every 10 s)
    (19, 49, False),  # trouble since 30, not yet nodeLostSeconds (20) long
    (20, 50, True),   # no renewal seen for nodeLostSeconds: lost, long before NotReady (50 s)
])
def test_a_node_whose_lease_went_silent_is_lost_after_node_lost_seconds(
    silence: int, now: int, restarts: bool
) -> None:
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"), PodBuilder(1).running().on_node("b"),
                 workers=2)
    trouble = heartbeat_trouble("b", silence, at(now))
    troubles = {"b": trouble} if trouble else {}
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(now),
                            troubles=troubles)
    assert (action.kind is ActionKind.RESTART_GROUP_UNCOUNTED) is restarts, action
    if restarts:
        assert action.message.startswith(
            "restarting group: worker-1 lost its node: node b last renewed its Lease at "
            "12:00:30 (no renewal seen for 20s; its kubelet renews every 10s)"), action.message


@pytest.mark.parametrize(("answering", "polled", "missed", "restarts"), [
    (True, 35, None, False),  # answered a poll made after the last renewal: the node is up
    (True, 25, None, True),   # its last answer came before the silence began: no evidence
    (False, 35, (2, 33), True),   # asked twice and silent: corroborated
    (False, 35, (1, 35), False),  # one slow answer, from a busy node: asked again first
    (False, 35, (1, 28), True),   # silent before the Lease was: no evidence the node is up
])
def test_a_silent_lease_is_not_a_lost_node_while_the_worker_still_answers(
    answering: bool, polled: int, missed: tuple[int, int] | None, restarts: bool
) -> None:
    """A kubelet restarting or cut off from the API server alone leaves the node and its
    pods running: a worker that still answers /progress vetoes the restart. `missed`: the
    unanswered polls in a row and when the first was made."""
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"), PodBuilder(1).running().on_node("b"),
                 workers=2)
    trouble = heartbeat_trouble("b", 30, at(60))
    assert trouble is not None
    troubles = {"b": trouble}
    silent = {"missed_polls": missed[0], "silent_since": at(missed[1])} if missed else {}
    health = GroupHealth(0, (WorkerTrack(0, answering=True),
                             WorkerTrack(1, answering=answering, **silent)), at(polled))
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(60),
                            troubles=troubles, health=health)
    assert (action.kind is ActionKind.RESTART_GROUP_UNCOUNTED) is restarts, action


def test_the_earliest_trouble_of_a_node_is_the_one_that_counts() -> None:
    status = node_trouble("b", UNREACHABLE_SINCE_30)
    silent = heartbeat_trouble("b", 50, at(70))  # last renewal at 20
    assert silent is not None and status is not None
    first = combined(status, silent)
    assert first is not None and first.reason == "HeartbeatStale" and first.reported is status
    later = heartbeat_trouble("b", 30, at(70))  # last renewal at 40
    assert combined(status, later) is status and combined(status, None) is status
    assert combined(None, silent) is silent and combined(None, None) is None
    gone = node_trouble("b", None)
    assert combined(gone, silent) is gone


@pytest.mark.parametrize(("now", "restarts"), [
    (55, False),  # silent since 10, the worker answers, the node still reported Ready
    (69, False),  # NotReady since 50 (the node monitor's grace): not yet nodeLostSeconds long
    (70, True),   # NotReady for nodeLostSeconds: lost, however well its worker trains
])
def test_a_partitioned_node_whose_workers_answer_is_lost_once_the_control_plane_says_so(
    now: int, restarts: bool
) -> None:
    """A node cut off from the API server alone: its Lease goes silent but its worker answers
    the operator's polls, which vetoes the silent Lease. The veto must not hide what the node
    controller then reports: nothing can stop or evict pods there, so the group restarts."""
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"),
                 PodBuilder(1).running().scheduled(5).on_node("b"), workers=2)
    not_ready = {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": stamp(50)}]}}
    reported = node_trouble("b", not_ready) if now >= 50 else None
    trouble = combined(reported, heartbeat_trouble("b", now - 10, at(now)))
    assert trouble is not None and trouble.reason == "HeartbeatStale"
    health = GroupHealth(0, (WorkerTrack(0, answering=True), WorkerTrack(1, answering=True)),
                         at(now - 1))
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(now),
                            troubles={"b": trouble}, health=health)
    assert (action.kind is ActionKind.RESTART_GROUP_UNCOUNTED) is restarts, action
    # When to look again: never for the explained-away silence alone (it was due at 30 and
    # would wake the job at once, again and again), at 70 once the node is reported.
    deadline = lost_node_deadline(spec, pods, {"b": trouble}, health)
    assert deadline == (at(70) if reported else None), deadline
    if restarts:
        assert "worker-1 lost its node: node b is unreachable since 12:00:50" in action.message


def test_a_worker_bound_to_a_node_whose_lease_is_already_silent_is_lost_with_it() -> None:
    """The scheduler takes a silent node for Ready (NotReady comes ~50 s later): a pod bound
    there after the silence began never starts, and the binding proves nothing."""
    spec = make_spec(health={"nodeLostSeconds": 20})
    pods = group(PodBuilder(0).running().on_node("a"),
                 PodBuilder(1).running().scheduled(45).on_node("b"), workers=2)
    trouble = heartbeat_trouble("b", 30, at(60))  # last renewal at 30
    assert trouble is not None
    action = failure_action(spec, JobStatus(), pods, group_started=True, now=at(60),
                            troubles={"b": trouble})
    assert action.kind is ActionKind.RESTART_GROUP_UNCOUNTED, action


AFFINITY = "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
INSUFFICIENT_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
BOTH = {"node-a", "node-b"}  # avoided nodes that could hold the pods (fit.may_host)
SILENT_A = {"node-a": NodeTrouble("node-a", "HeartbeatStale", at(0), "Lease silent")}


@pytest.mark.parametrize(("pods", "troubles", "could_host", "kind"), [
    # Refused away from node-a, whose Lease is renewed again: placed again.
    ([PodBuilder(0).avoiding("node-a").unschedulable(AFFINITY), *running(1, 2)], {}, BOTH,
     ActionKind.REPLACE_GROUP),
    # node-a still silent: look again in a few seconds.
    ([PodBuilder(0).avoiding("node-a").unschedulable(AFFINITY), *running(1, 2)], SILENT_A, BOTH,
     ActionKind.WAIT),
    # One of two avoided nodes back is enough.
    ([PodBuilder(0).avoiding("node-a", "node-b").unschedulable(AFFINITY), *running(1, 2)],
     SILENT_A, BOTH, ActionKind.REPLACE_GROUP),
    # Not refused yet (the scheduler has not looked), or bound: nothing to do.
    ([PodBuilder(0).avoiding("node-a"), *running(1, 2)], {}, BOTH, ActionKind.NONE),
    ([PodBuilder(0).avoiding("node-a").running(), *running(1, 2)], {}, BOTH, ActionKind.NONE),
    # Refused, but created to avoid nothing: the startup timeout's case, not this one.
    ([PodBuilder(0).unschedulable(AFFINITY), *running(1, 2)], {}, BOTH, ActionKind.NONE),
    # Back, but it could never hold the group's pods (a CPU node for a GPU group): no reason
    # to place the group again and restart its start-up clock; look again later.
    ([PodBuilder(0).avoiding("node-a").unschedulable(INSUFFICIENT_GPU), *running(1, 2)], {},
     set(), ActionKind.WAIT),
])
def test_a_group_refused_away_from_a_node_that_is_back_is_placed_again(
    pods: list[PodBuilder], troubles: dict[str, NodeTrouble], could_host: set[str],
    kind: ActionKind,
) -> None:
    action = replacement_action(group(*pods), troubles, could_host)
    assert action.kind is kind
    if kind is ActionKind.REPLACE_GROUP:
        assert action.reason == "AvoidedNodeBack" and action.culprit is None
        assert action.message.startswith("worker-0 cannot be scheduled away from node-a")
    if kind is ActionKind.WAIT:
        assert 0 < action.delay_seconds <= 5
