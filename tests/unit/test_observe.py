from __future__ import annotations

from typing import Any

import pytest
from multiworker.decide.observe import Classified, ObservedGroup, observe_group
from multiworker.decide.workers import WorkerPhase, tail

from tests.unit.builders import JOB, JOB_UID, PodBuilder, at


def observe(*pods: dict[str, Any], workers: int = 3, generation: int = 0) -> ObservedGroup:
    return observe_group(pods, job=JOB, job_uid=JOB_UID, workers=workers,
                         generation=generation, container="tensorflow")


def test_missing_workers_and_readiness() -> None:
    group = observe(PodBuilder(0).running().build(), PodBuilder(1).running(ready=False).build())
    assert [w.phase for w in group.workers] == [
        WorkerPhase.RUNNING, WorkerPhase.RUNNING, WorkerPhase.MISSING
    ]
    assert group.ready == 1 and not group.all_running and group.has_pods


def test_stale_and_foreign_pods_are_set_apart() -> None:
    group = observe(
        PodBuilder(0, generation=1).running().build(),
        PodBuilder(0, generation=0).running().deleted(requested=3).build(),
        PodBuilder(5, generation=1).running().build(),  # index beyond spec.workers
        PodBuilder(1, generation=1).owned_by("someone-else").build(),
        generation=1,
    )
    assert group.workers[0].phase is WorkerPhase.RUNNING
    assert [(p.name, p.generation) for p in group.stale] == [
        ("demo-worker-0", 0), ("demo-worker-5", 1)
    ]
    assert group.stale[0].deletion == at(33) and group.stale[1].deletion is None
    assert group.foreign == ("demo-worker-1",)
    assert group.workers[1].phase is WorkerPhase.MISSING


@pytest.mark.parametrize(
    ("pod", "phase", "reason", "exit_code"),
    [
        (PodBuilder(0).exited(0, "Completed"), WorkerPhase.SUCCEEDED, "", None),
        (PodBuilder(0).exited(1), WorkerPhase.FAILED, "Error", 1),
        (PodBuilder(0).exited(137, "OOMKilled"), WorkerPhase.FAILED, "OOMKilled", 137),
        (PodBuilder(0).evicted(), WorkerPhase.DISRUPTED, "Evicted", None),
        (PodBuilder(0).running().deleted(requested=5), WorkerPhase.DISRUPTED, "Deleted", None),
        (PodBuilder(0).running().disruption_target("PreemptionByScheduler"),
         WorkerPhase.DISRUPTED, "Preempted", None),
        (PodBuilder(0).running().disruption_target("DeletionByTaintManager"),
         WorkerPhase.DISRUPTED, "NodeLost", None),
        # SIGTERM from the deletion made it exit 143: still the deletion's doing.
        (PodBuilder(0).exited(143, finished=8).deleted(requested=5), WorkerPhase.DISRUPTED,
         "Deleted", None),
        # It had already crashed when somebody deleted it: a failure.
        (PodBuilder(0).exited(1, finished=4).deleted(requested=5), WorkerPhase.FAILED, "Error", 1),
        (PodBuilder(0).exited(137, finished=9).evicted()
         .disruption_target("TerminationByKubelet", when=5), WorkerPhase.DISRUPTED,
         "Evicted", None),
        # An eviction of unknown timing does not excuse the exit (it may not have caused it).
        (PodBuilder(0).exited(137, finished=9).evicted(), WorkerPhase.FAILED, "Error", 137),
        # Evicted for using more than it asked for: the job's own failure.
        (PodBuilder(0).running().evicted("Container tensorflow was using 3Gi, which exceeds "
                                         "its request of 1Gi."),
         WorkerPhase.FAILED, "EvictedForResourceUsage", None),
        (PodBuilder(0).unschedulable("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
         WorkerPhase.PENDING, "Unschedulable", None),
        (PodBuilder(0).waiting("ImagePullBackOff", "Back-off pulling image"),
         WorkerPhase.STARTING, "ImagePullBackOff", None),
        (PodBuilder(0).waiting("CreateContainerConfigError", 'secret "s" not found'),
         WorkerPhase.STARTING, "CreateContainerConfigError", None),
        (PodBuilder(0), WorkerPhase.PENDING, "Pending", None),
    ],
)
def test_classification(
    pod: PodBuilder, phase: WorkerPhase, reason: str, exit_code: int | None
) -> None:
    worker = observe(pod.build()).workers[0]
    assert (worker.phase, worker.reason, worker.exit_code) == (phase, reason, exit_code)


def test_failure_carries_message_tail_and_time() -> None:
    message = "\n".join(f"line {i}" for i in range(10))
    worker = observe(PodBuilder(2).exited(1, message=message, finished=42).build()).workers[2]
    assert worker.message == "line 7\nline 8\nline 9"
    assert worker.since == at(42)
    assert worker.pod == "demo-worker-2"


def test_pending_message_names_the_scheduler_reason() -> None:
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    worker = observe(PodBuilder(0).created(7).unschedulable(message).build()).workers[0]
    assert worker.message == message and worker.since == at(7)
    assert worker.avoided_nodes == ()
    avoiding = observe(PodBuilder(0).avoiding("n1", "n2").unschedulable(message).build())
    assert avoiding.workers[0].avoided_nodes == ("n1", "n2")
    # Only a refusal makes it matter: a pod the scheduler has not looked at yet, or bound.
    assert observe(PodBuilder(0).avoiding("n1").build()).workers[0].avoided_nodes == ()
    assert observe(PodBuilder(0).avoiding("n1").running().build()).workers[0].avoided_nodes == ()


def test_sidecar_does_not_hide_the_trainers_exit() -> None:
    pod = PodBuilder(0).exited(3).build()
    pod["status"]["phase"] = "Running"
    pod["status"]["containerStatuses"].append({"name": "sidecar", "state": {"running": {}}})
    worker = observe(pod).workers[0]
    assert (worker.phase, worker.exit_code) == (WorkerPhase.FAILED, 3)


def test_init_container_failure() -> None:
    pod = PodBuilder(0).build()
    pod["status"].update(phase="Failed", initContainerStatuses=[
        {"name": "fetch", "state": {"terminated": {"exitCode": 7, "reason": "Error",
                                                   "message": "no data"}}}
    ])
    worker = observe(pod).workers[0]
    assert (worker.phase, worker.exit_code) == (WorkerPhase.FAILED, 7)
    assert worker.message == "init container fetch: no data"


def test_tail_limits_characters() -> None:
    assert len(tail("x" * 5000)) == 600


def _versioned(pod: dict[str, Any], version: str) -> dict[str, Any]:
    pod["metadata"]["resourceVersion"] = version
    return pod


def test_a_pass_after_one_pod_event_classifies_that_pod_alone() -> None:
    """observe.Classified: pod states are reused until the pod's resource version changes."""
    classified = Classified()
    pods = [_versioned(PodBuilder(i).waiting("ContainerCreating").build(), "1")
            for i in range(64)]

    def look() -> ObservedGroup:
        return observe_group(pods, job=JOB, job_uid=JOB_UID, workers=64, generation=0,
                             container="tensorflow", classified=classified)

    assert look().ready == 0 and classified.computed == 64
    assert look().ready == 0 and classified.computed == 64  # nothing changed: nothing judged
    pods[7] = _versioned(PodBuilder(7).running().build(), "2")  # one pod's event
    group = look()
    assert classified.computed == 65
    assert group.workers[7].phase is WorkerPhase.RUNNING and group.ready == 1
    assert group.workers[6].phase is WorkerPhase.STARTING


def test_classified_states_forget_pods_that_are_gone_and_judge_a_new_pod_afresh() -> None:
    classified = Classified()
    first = _versioned(PodBuilder(0).exited(1).build(), "5")
    observe_group([first], job=JOB, job_uid=JOB_UID, workers=1, generation=0,
                  container="tensorflow", classified=classified)
    # The next generation's pod: same name, another uid, a version that happens to match.
    second = _versioned(PodBuilder(0, generation=1).running().build(), "5")
    group = observe_group([second], job=JOB, job_uid=JOB_UID, workers=1, generation=1,
                          container="tensorflow", classified=classified)
    assert group.workers[0].phase is WorkerPhase.RUNNING and classified.computed == 2
    assert len(classified._by_uid) == 1  # the first pod's state is forgotten
