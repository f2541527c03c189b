"""The runtime's pure pieces: resume plans, stop-check pacing, abort summaries."""

from __future__ import annotations

import pytest
from multiworker.runtime.aborts import describe_abort
from multiworker.runtime.config import load_config
from multiworker.runtime.preemption import (
    MAX_STEPS_BETWEEN_CHECKS,
    steps_between_checks,
)
from multiworker.runtime.resume import Segment, plan_segments

CONFIG = load_config(
    {
        "TF_CONFIG": '{"cluster": {"worker": ["w-0:1", "w-1:1", "w-2:1"]}, '
        '"task": {"type": "worker", "index": 0}}'
    }
)


@pytest.mark.parametrize(
    ("restored", "expected"),
    [
        (0, [Segment(0, 5, 10)]),
        (30, [Segment(3, 5, 10)]),
        (34, [Segment(3, 4, 6), Segment(4, 5, 10)]),
        (47, [Segment(4, 5, 3)]),
        (50, []),
    ],
)
def test_resume_continues_at_the_exact_step(
    restored: int, expected: list[Segment]
) -> None:
    segments = plan_segments(restored, steps_per_epoch=10, epochs=5)
    assert segments == expected
    assert (
        restored
        + sum((s.epochs - s.initial_epoch) * s.steps_per_epoch for s in segments)
        == 50
    )


@pytest.mark.parametrize(
    ("steps", "seconds", "expected"),
    [(1, 0.010, 100), (100, 1.0, 100), (1, 2.0, 1), (3, 0.0, MAX_STEPS_BETWEEN_CHECKS)],
)
def test_stop_checks_are_paced_to_about_once_a_second(
    steps: int, seconds: float, expected: int
) -> None:
    assert steps_between_checks(steps, seconds) == expected


HEARTBEAT_ERROR = """Graph execution error:

Detected at node sgd/CollectiveReduceV2 defined at (most recent call last):
  File "train.py", line 1, in <module>
{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} \
Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are \
unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:2
The tasks have crashed. Check the task logs for an earlier error.
"""


def test_abort_summary_names_the_cause_and_the_suspect_peer() -> None:
    summary = describe_abort("UnavailableError", HEARTBEAT_ERROR, CONFIG)
    assert summary == (
        "collective aborted (UnavailableError): Error reported from /job:worker/task:2: "
        "The following tasks are unhealthy (stopped sending heartbeats): "
        "/job:worker/replica:0/task:2; suspect peers: worker 2 (w-2:1); "
        "a peer died or stopped answering, the group must restart"
    )


def test_abort_summary_without_a_named_peer() -> None:
    message = (
        "Collective has timed out waiting for other workers. [Op:CollectiveReduceV2]"
    )
    assert describe_abort("DeadlineExceededError", message, CONFIG).startswith(
        "collective aborted (DeadlineExceededError): Collective has timed out waiting for other "
        "workers. [Op:CollectiveReduceV2]; a peer died"
    )
