"""A script that dies the same way before its first step in two groups in a row fails the job
at once (startup.startup_error, spec.restartPolicy.failFastOnRepeatedStartupError)."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.api.status import FailureRecord, JobStatus
from multiworker.decide.observe import ObservedGroup, observe_group
from multiworker.decide.policy import Action, ActionKind, failure_action
from multiworker.decide.progress import GroupHealth, Report, WorkerTrack
from multiworker.reconcile.events import event_type

from tests.unit.builders import JOB, JOB_UID, PodBuilder, at, make_spec

IMPORT = ("Traceback (most recent call last):\n  File \"/app/train.py\", line 3, in <module>\n"
          "ModuleNotFoundError: No module named 'transformers'\n")
SHAPES = "InvalidArgumentError: Incompatible shapes: [32,10] vs. [64,10]\n"
PEERS = "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed\n"


def failed(message: str, code: int = 1, ran: float = 5) -> ObservedGroup:
    pods = [PodBuilder(0).running(), PodBuilder(2).running(),
            PodBuilder(1).exited(code, message=message, started=10, finished=10 + ran)]
    return observe_group([p.build() for p in pods], job=JOB, job_uid=JOB_UID, workers=3,
                         generation=0, container="tensorflow")


def reports(step: int, restored: int) -> GroupHealth:
    report = Report(worker_index=0, generation=0, phase="training", step=step,
                    restored_from_step=restored)
    return GroupHealth(0, (WorkerTrack(0, report=report, answering=True),), at(20))


def decide(group: ObservedGroup, status: JobStatus, health: GroupHealth | None = None,
           **policy: Any) -> Action:
    return failure_action(make_spec(restartPolicy=policy), status, group, group_started=True,
                          now=at(60), health=health)


def after(first: Action, restarts: int = 1) -> JobStatus:
    """The status once the operator acted on `first` (a restart recorded as lastFailure)."""
    assert first.culprit is not None
    return JobStatus(restarts=restarts, last_failure=FailureRecord(
        worker=first.culprit.worker, generation=0, reason="Error", exit_code=1,
        message=first.culprit.message, time=at(15), action=first.kind.value,
        startup_error=first.culprit.startup_error))


def test_the_same_error_before_a_step_twice_fails_the_job_with_its_words_and_a_hint() -> None:
    first = decide(failed(IMPORT), JobStatus())
    assert first.kind is ActionKind.RESTART_GROUP
    assert "hint: the image lacks that module" in first.message  # said from the first time
    second = decide(failed(IMPORT), after(first))
    assert (second.kind, second.reason) == (ActionKind.FAIL_JOB, "RepeatedStartupError")
    assert second.message.startswith(
        "worker-1 exited 1 (Error: ModuleNotFoundError: No module named 'transformers'); "
        "generation 0 died of the same error before training a step")
    assert "failFastOnRepeatedStartupError" in second.message
    assert "hint: the image lacks that module" in second.message
    assert event_type(second.reason) == "Warning"


@pytest.mark.parametrize(
    ("first", "second", "health", "policy", "ran"),
    [
        pytest.param(IMPORT, SHAPES, None, {}, 5, id="a different error"),
        pytest.param(IMPORT, IMPORT, None, {"failFastOnRepeatedStartupError": False}, 5,
                     id="turned off"),
        pytest.param(IMPORT, IMPORT, None, {}, 400, id="a script without progress that ran 400s"),
        pytest.param(SHAPES, SHAPES, reports(step=120, restored=100), {}, 5,
                     id="after a step the group trained"),
        pytest.param(PEERS, PEERS, None, {}, 5, id="a peer's error"),
        pytest.param("", "", None, {}, 5, id="no exception shown"),
    ],
)
def test_handled_as_before(first: str, second: str, health: GroupHealth | None,
                           policy: dict[str, Any], ran: float) -> None:
    earlier = decide(failed(first, ran=ran), JobStatus(), health, **policy)
    action = decide(failed(second, ran=ran), after(earlier), health, **policy)
    assert (action.kind, action.reason) == (ActionKind.RESTART_GROUP, "WorkerFailed")


def test_a_group_that_restored_but_trained_no_step_is_still_starting() -> None:
    health = reports(step=100, restored=100)
    first = decide(failed(SHAPES, ran=400), JobStatus(), health)
    assert first.culprit is not None and first.culprit.startup_error is not None
    assert decide(failed(SHAPES, ran=400), after(first), health).reason == "RepeatedStartupError"


@pytest.mark.parametrize("code", [137, 143, 3, 4])
def test_signals_and_the_runtimes_peer_exits_are_no_startup_error(code: int) -> None:
    action = decide(failed(IMPORT, code=code), JobStatus())
    assert action.culprit is not None and action.culprit.startup_error is None
