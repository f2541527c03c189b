"""The pure progress rules: reports, per-worker tracks, the group's progress and hangs."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.health import (
    GroupHealth,
    Report,
    Targets,
    describe_stall,
    find_stall,
    parse_report,
    progress_key,
    progress_of,
    track,
)

from tests.unit.builders import at


def raw(index: int = 0, step: int = 10, phase: str = "training", generation: int = 0,
        **fields: Any) -> dict[str, Any]:
    return {"workerIndex": index, "generation": generation, "phase": phase, "step": step,
            "epoch": step // 10, "stepsPerSecond": 2.5, "loss": 0.25, "lastCheckpointStep": 10,
            "restoredFromStep": 0, "updatedAt": 1767268800.5, **fields}


def report(index: int = 0, step: int = 10, phase: str = "training", **fields: Any) -> Report:
    parsed = parse_report(raw(index, step, phase, **fields), index, 0)
    assert parsed is not None
    return parsed


TARGETS = Targets(generation=0, port=8471, workers=((0, "10.88.0.5"), (1, "10.88.0.6")),
                  all_running=True, progress_timeout=20)


def polls(*rounds: tuple[float, dict[int, Report | None]],
          targets: Targets = TARGETS) -> GroupHealth:
    """Feed polls at the given seconds after T0; the tracks after the last."""
    health: GroupHealth | None = None
    for seconds, answers in rounds:
        health = track(health, targets, answers, at(seconds))
    assert health is not None
    return health


def test_parse_report_reads_the_contract() -> None:
    r = report(step=63, restoredFromStep=40)
    assert (r.step, r.epoch, r.steps_per_second, r.loss, r.restored_from_step) == (
        63, 6, 2.5, 0.25, 40)
    assert r.updated_at is not None and r.updated_at.isoformat() == "2026-01-01T12:00:00.500000+00:00"


@pytest.mark.parametrize("body", [
    None, "not json", [], {"workerIndex": 0},  # missing fields
    raw(index=1),  # another worker answered on this IP
    raw(generation=1),  # an older or newer generation
    {**raw(), "step": "many"},
], ids=["none", "text", "list", "partial", "other worker", "other generation", "bad step"])
def test_anything_else_is_no_report(body: Any) -> None:
    assert parse_report(body, 0, 0) is None


def test_nan_loss_and_missing_times_are_dropped() -> None:
    r = parse_report(raw(loss=float("nan"), updatedAt=None, stepsPerSecond=None), 0, 0)
    assert r is not None and (r.loss, r.updated_at, r.steps_per_second) == (None, None, 0.0)


def test_a_worker_advances_on_new_steps_and_phases_only() -> None:
    health = polls(
        (0, {0: report(phase="waiting-for-peers", step=0), 1: None}),
        (3, {0: report(phase="training", step=0), 1: report(1, step=0)}),
        (6, {0: report(step=5), 1: report(1, step=0)}),
        (9, {0: report(step=5), 1: None}),
    )
    chief, other = health.workers
    assert chief.advanced_at == at(6) and chief.answering and chief.silent_since is None
    assert other.advanced_at == at(3) and not other.answering and other.silent_since == at(9)
    assert other.report is not None and other.report.step == 0  # the last answer is kept


def test_a_new_generation_starts_afresh() -> None:
    health = polls((0, {0: report(step=50), 1: report(1, step=50)}))
    newer = Targets(generation=1, port=8471, workers=((0, "10.88.0.9"),), all_running=False)
    health = track(health, newer, {0: None}, at(5))
    assert health.generation == 1 and health.workers[0].report is None
    assert health.running_since is None


def test_progress_is_the_chiefs() -> None:
    health = polls((0, {0: report(step=63, restoredFromStep=40), 1: report(1, step=64)}))
    progress = progress_of(health)
    assert progress is not None
    assert (progress.step, progress.resumed_from_step, progress.last_checkpoint_step) == (
        63, 40, 10)
    assert progress_key(progress) == (63, 6, 10, 40)
    assert progress_of(polls((0, {0: None, 1: report(1)}))) is None


@pytest.mark.parametrize(("reported", "expected"),
                         [(0.96875, 0.96875), (None, None), (float("nan"), None)])
def test_accuracy_reaches_status_when_reported(reported: Any, expected: float | None) -> None:
    body = raw(accuracy=reported) if reported is not None else raw()
    progress = progress_of(polls((0, {0: parse_report(body, 0, 0), 1: None})))
    assert progress is not None and progress.accuracy == expected


# --- hangs ---


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
    assert describe_stall(stall) == (
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


def test_a_group_that_never_answers_stalls_from_when_it_was_running() -> None:
    health = polls(*[(t, {0: None, 1: None}) for t in (0, 10, 19)])
    assert find_stall(health, 20) is None
    health = track(health, TARGETS, {0: None, 1: None}, at(20))
    stall = find_stall(health, 20)
    assert stall is not None and stall.first.index == 0 and stall.stopped_at == at(0)
    assert "worker-0 stopped first without ever answering (polled since 12:00:00)" in (
        describe_stall(stall))


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
    message = describe_stall(stall)
    assert message.count("worker-") == 4 and message.endswith("4 more workers stopped later")
