"""The hang rule (hang.py): when a running group counts as hung, who stopped first, and when
detection is inactive because no worker ever reported."""

from __future__ import annotations

from multiworker.decide.hang import find_stall, inactive_reason
from multiworker.decide.progress import Targets, track

from tests.unit.builders import at
from tests.unit.test_progress import TARGETS, polls, report


def test_no_stall_while_some_worker_advances() -> None:
    health = polls(*[(t, {0: report(step=10), 1: report(1, step=int(t))})
                     for t in range(0, 60, 3)])
    assert find_stall(health, 20) is None


def test_stopped_worker_is_named_first_when_both_stall() -> None:
    # worker-1 is SIGSTOPped after step 63: it stops answering, and worker-0 waits in the
    # collective, answering at the same step.
    health = polls(
        (0, {0: report(step=60), 1: report(1, step=60)}),
        (3, {0: report(step=63), 1: report(1, step=63)}),
        (6, {0: report(step=63), 1: None}),
        *[(t, {0: report(step=63), 1: None}) for t in range(9, 24, 3)],
    )
    assert find_stall(health, 20) is None  # quiet for 18s
    health = track(health, TARGETS, {0: report(step=63), 1: None}, at(24))
    stall = find_stall(health, 20)
    assert stall is not None
    assert stall.first.index == 1 and stall.stopped_at == at(3)
    assert stall.quiet.total_seconds() == 21
    assert stall.describe() == (
        "no progress for 21s: worker-1 stopped first at step 63 (unreachable since 12:00:06); "
        "worker-0 at step 63 (answering)")


def test_earliest_last_advance_is_first_even_when_answering() -> None:
    health = polls(
        (0, {0: report(step=5), 1: report(1, step=5)}),
        (3, {0: report(step=5), 1: report(1, step=6)}),
        (30, {0: report(step=5), 1: report(1, step=6)}),
    )
    stall = find_stall(health, 20)
    assert stall is not None and stall.first.index == 0


def test_a_group_that_never_answers_is_not_hung_but_detection_is_inactive() -> None:
    """A script that serves no /progress: "never reported" is not "stopped progressing"."""
    health = polls(*[(t, {0: None, 1: None}) for t in (0, 10, 19)])
    assert inactive_reason(health, 20, 8471) is None  # still starting
    health = track(health, TARGETS, {0: None, 1: None}, at(60))
    assert find_stall(health, 20) is None
    reason = inactive_reason(health, 20, 8471)
    assert reason is not None and reason.startswith(
        "hang detection is inactive: no worker of generation 0 has answered GET /progress on "
        "port 8471 in 60s")
    assert inactive_reason(health, None, 8471) is None  # detection is off anyway


def test_one_worker_never_answering_among_reporting_ones_is_blamed() -> None:
    health = polls((0, {0: report(step=5), 1: None}), (30, {0: report(step=5), 1: None}))
    stall = find_stall(health, 20)
    assert stall is not None and stall.first.index == 1
    assert "worker-1 stopped first without ever answering (polled since 12:00:00)" in (
        stall.describe())
    assert inactive_reason(health, 20, 8471) is None


def test_start_up_stages_each_get_the_whole_timeout() -> None:
    health = polls(
        (0, {0: None, 1: None}),  # importing TensorFlow
        (15, {0: report(phase="waiting-for-peers", step=0),
              1: report(1, phase="waiting-for-peers", step=0)}),
        (30, {0: report(phase="training", step=0), 1: report(1, phase="training", step=0)}),
        (45, {0: report(phase="training", step=0), 1: report(1, phase="training", step=0)}),
    )
    assert find_stall(health, 20) is None


def test_no_clock_before_the_whole_group_runs() -> None:
    starting = Targets(generation=0, port=8471, workers=((0, "10.88.0.5"),), all_running=False)
    health = polls((0, {0: None}), (100, {0: None}), targets=starting)
    assert health.running_since is None and find_stall(health, 20) is None
    health = track(health, TARGETS, {0: None, 1: None}, at(101))
    assert health.running_since == at(101) and find_stall(health, 20) is None


def test_finished_workers_are_not_hung() -> None:
    health = polls(
        (0, {0: report(phase="done", step=160), 1: report(1, phase="done", step=160)}),
        (60, {0: report(phase="done", step=160), 1: report(1, phase="done", step=160)}),
    )
    assert find_stall(health, 20) is None


def test_a_large_group_names_a_few_workers() -> None:
    many = Targets(generation=0, port=8471, all_running=True,
                   workers=tuple((i, f"10.88.0.{i}") for i in range(8)))
    health = polls((0, {i: report(i, step=5) for i in range(8)}),
                   (30, {i: report(i, step=5) for i in range(8)}), targets=many)
    stall = find_stall(health, 20)
    assert stall is not None and stall.first.index == 0
    message = stall.describe()
    assert message.count("worker-") == 4 and message.endswith("4 more workers stopped later")
