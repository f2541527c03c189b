"""A randomized, seeded simulation of one elastic, Kueue-queued job meeting the systems around
it — the scheduler refusing and binding its pods (its clock off), Kueue admitting, admitting in
part and evicting, trainers failing or finishing (their kubelets' clocks off), status writes
failing halfway, the node's Lease going silent and renewed again, a new leader with nothing in
memory — with the reconcile pass run after each event and the invariants checked after every pass.

Tests check each decision alone; defects live in the sequences in which systems meet. This one
found, on the code before it: quota given back while pods ran (a job ending), a pass asking to
run again at once for ever (a group refused at minWorkers), a shrink that gave up its Kueue
admission, and a shrink timed by the scheduler's clock. On a failure hypothesis prints the
shortest sequence it found, step by step, and the seed (`--hypothesis-seed` replays it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from multiworker.api import names
from multiworker.api.names import QUEUE_LABEL
from multiworker.decide.nodes import STALE_HEARTBEAT_SECONDS
from multiworker.decide.observe import Classified
from multiworker.decide.queueing import FINALIZER
from multiworker.reconcile.context import Options
from multiworker.reconcile.reconcile import reconcile

from tests.unit.builders import NAMESPACE, job_body
from tests.unit.fake_cluster import FakeCluster

KUEUE = Options(kueue=True)
SHRINK_AFTER = 30
WORKERS = 3
NODE = "node-1"  # the fake cluster's one node
REFUSAL = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
Manifest = dict[str, Any]


def _active(pod: Manifest) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _generation(pod: Manifest) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(names.LABEL_GROUP_GENERATION)


def _refused(pod: Manifest) -> bool:
    return not (pod.get("spec") or {}).get("nodeName") and any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class Observer:
    """What the simulation knows beside the operator, to judge it: when a pass first saw each
    refused pod (the operator's clock), the Workloads ever made."""

    refusal_seen: dict[str, datetime] = field(default_factory=dict)  # pod uid -> pass time
    workloads: list[str] = field(default_factory=list)


class AJobMeetsItsCluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        body = job_body(workers=WORKERS,
                        elastic={"minWorkers": 2, "shrinkAfterSeconds": SHRINK_AFTER},
                        health={"startupTimeoutSeconds": None},
                        restartPolicy={"maxRestarts": 3, "backoffSeconds": 1})
        body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
        self.cluster = FakeCluster(body)
        self.cluster.objects["a100"] = {"metadata": {"name": "a100"}, "spec": {}}
        self.seen = Observer()
        # What the leading operator keeps between passes (controller.py): its pods' states as
        # classified, and when it last wrote the status. A new leader starts with neither.
        self.classified = Classified()
        self.last_write: datetime | None = None
        self.requeue: float | None = None
        self.changed = True
        self.events_before = 0
        self.status_before: Manifest = {}
        self.run_pass(0)

    # --- the pass, and what each one must leave true ---

    def snapshot(self) -> Any:
        c = self.cluster
        return copy.deepcopy((c.job, c.pods, c.workloads))

    def run_pass(self, seconds: float) -> None:
        c = self.cluster
        c.now += timedelta(seconds=seconds)
        for pod in c.pods.values():  # the refusals this pass sees, on the operator's clock
            if _refused(pod):
                self.seen.refusal_seen.setdefault(pod["metadata"]["uid"], c.now)
        before, self.events_before = self.snapshot(), len(c.events)
        self.status_before = copy.deepcopy(c.status)
        try:
            outcome = reconcile(c, NAMESPACE, "demo", c.now, options=KUEUE,
                                classified=self.classified, last_write=self.last_write)
        except RuntimeError:  # a status write failed: the pass wrote nothing more
            self.requeue, self.changed = None, True
            return
        if outcome.written is not None:
            self.last_write = c.now
        self.requeue = outcome.requeue
        self.changed = self.snapshot() != before
        for name in c.workloads:
            if name not in self.seen.workloads:
                self.seen.workloads.append(name)
        self.check_pass()

    def check_pass(self) -> None:
        c, before = self.cluster, self.status_before
        new_events = [reason for _, reason, _ in c.events[self.events_before:]]
        # Run again at once only when the pass changed something: else a hot loop.
        assert self.requeue != 0 or self.changed, "requeue 0 from a pass that changed nothing"
        # A resize is explained by its Event, and waited for on the operator's clock.
        if c.status.get("resizes", 0) > before.get("resizes", 0):
            assert {"Shrunk", "Grown"} & set(new_events), new_events
        if "Shrunk" in new_events:
            refused = [self.seen.refusal_seen[p["metadata"]["uid"]] for p in c.pods.values()
                       if p["metadata"]["uid"] in self.seen.refusal_seen
                       and _generation(p) == str(before.get("groupGeneration", 0))]
            assert refused, "shrunk with no refusal seen"
            waited = (c.now - min(refused)).total_seconds()
            assert waited >= SHRINK_AFTER, f"shrunk after {waited:.0f}s of refusal"
        # Every restart and disruption is explained by an Event in the pass that counted it.
        for counter in ("restarts", "disruptions"):
            if c.status.get(counter, 0) > before.get(counter, 0):
                assert {"WorkerFailed", "WorkerDisrupted", "Evicted"} & set(new_events), (
                    counter, new_events)
        # A disruption never spends a restart.
        if "WorkerDisrupted" in new_events and "WorkerFailed" not in new_events:
            assert c.status.get("restarts", 0) == before.get("restarts", 0)

    @invariant()
    def quota_is_held_while_a_pod_runs(self) -> None:
        active = [n for n, p in self.cluster.pods.items() if _active(p)]
        for workload in self.cluster.workloads.values():
            finished = any(c.get("type") == "Finished" and c.get("status") == "True"
                           for c in (workload.get("status") or {}).get("conditions") or [])
            released = FINALIZER not in (workload["metadata"].get("finalizers") or [])
            assert not (active and (finished or released)), (
                f"quota given back (finished {finished}, finalizer gone {released}) "
                f"while {active} run")

    @invariant()
    def one_generation_trains(self) -> None:
        training = {_generation(p) for p in self.cluster.pods.values()
                    if (p.get("status") or {}).get("phase") == "Running"
                    and "deletionTimestamp" not in p["metadata"]}
        assert len(training) <= 1, training

    @invariant()
    def one_workload_for_the_whole_run(self) -> None:
        """The spec never changes here: a second Workload means the job gave up its place
        (its admission) for nothing."""
        assert len(self.seen.workloads) <= 1, self.seen.workloads

    # --- the world ---

    @rule(seconds=st.sampled_from([0, 1, 5, 15, 40, 120]))
    def time_passes(self, seconds: float) -> None:
        self.run_pass(seconds)

    def _workload(self) -> Manifest | None:
        return next(iter(self.cluster.workloads.values()), None)

    def _kueue_says(self, conditions: list[Manifest], admission: Manifest | None) -> None:
        workload = self._workload()
        if workload is None:
            return
        status: Manifest = {"conditions": conditions}
        if admission is not None:
            status["admission"] = admission
        workload["status"] = status
        workload["metadata"]["resourceVersion"] = str(
            int(workload["metadata"]["resourceVersion"]) + 1)
        self.run_pass(0)

    @rule(count=st.sampled_from([None, 2]))
    def kueue_admits(self, count: int | None) -> None:
        assignment: Manifest = {"name": "workers", "flavors": {"nvidia.com/gpu": "a100"}}
        if count is not None:
            assignment["count"] = count
        self._kueue_says(
            [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
             {"type": "Admitted", "status": "True", "reason": "Admitted"}],
            {"clusterQueue": "gpus", "podSetAssignments": [assignment]})

    @rule()
    def kueue_evicts(self) -> None:
        workload = self._workload()
        if workload is None or not (workload.get("status") or {}).get("admission"):
            return
        conditions = [c for c in workload["status"].get("conditions", [])
                      if c["type"] != "Evicted"]
        self._kueue_says([*conditions, {"type": "Evicted", "status": "True",
                                        "reason": "Preempted", "message": "by urgent"}],
                         workload["status"]["admission"])

    def _pod(self, index: int) -> Manifest | None:
        return self.cluster.pods.get(names.worker_name("demo", index))

    @rule(verdicts=st.lists(st.sampled_from(["bind", "wait", "refuse", "refuse-behind",
                                             "refuse-ahead"]),
                            min_size=WORKERS, max_size=WORKERS))
    def scheduler_decides(self, verdicts: list[str]) -> None:
        """For each pod not placed yet: bind it, leave it, or refuse it — the condition stamped
        by a scheduler whose clock is right, 120 s behind or an hour ahead."""
        skews = {"refuse": 0, "refuse-behind": -120, "refuse-ahead": 3600}
        for index, verdict in enumerate(verdicts):
            pod = self._pod(index)
            if pod is None or pod.get("spec", {}).get("nodeName") or not _active(pod) \
                    or "deletionTimestamp" in pod["metadata"]:
                continue
            if verdict == "bind" and NODE not in self.cluster.silent_nodes():
                self.cluster.run(index)  # (a node silent to the control plane takes none)
            elif verdict in skews and not _refused(pod):
                self.cluster.unschedulable(index, REFUSAL)
                stamp = self.cluster.now + timedelta(seconds=skews[verdict])
                pod["status"]["conditions"][0]["lastTransitionTime"] = stamp.isoformat()
        self.run_pass(0)

    @rule(index=st.integers(0, WORKERS - 1), code=st.sampled_from([0, 1, 137]),
          skew=st.sampled_from([0, -120, 3600]))
    def trainer_exits(self, index: int, code: int, skew: int) -> None:
        """A trainer ends; its kubelet stamps the end by a clock that is right, 120 s behind
        or an hour ahead."""
        pod = self._pod(index)
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            return
        self.cluster.exit(index, code)
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        terminated["finishedAt"] = (self.cluster.now + timedelta(seconds=skew)).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        self.run_pass(0)

    @rule()
    def kubelets_finish_deletions(self) -> None:
        self.cluster.finish_deletions()
        self.run_pass(0)

    @rule()
    def next_status_write_fails(self) -> None:
        self.cluster.fail_status_writes = 1

    @rule(silent=st.booleans())
    def node_heartbeat(self, silent: bool) -> None:
        """The node's kubelet stops renewing its Lease (a partition, a frozen node), or
        renews it again."""
        self.cluster.silences[NODE] = 2 * STALE_HEARTBEAT_SECONDS if silent else 0.0
        self.run_pass(0)

    @rule()
    def a_new_leader_takes_over(self) -> None:
        """The leading operator dies; another instance leads with nothing in memory."""
        self.classified, self.last_write = Classified(), None
        self.run_pass(0)


AJobMeetsItsCluster.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_a_job_meets_its_cluster = AJobMeetsItsCluster.TestCase
