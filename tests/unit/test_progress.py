"""The pure progress rules: the report schema, per-worker tracks and the group's progress."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multiworker.decide.progress import (
    MAX_REPORT_BYTES,
    BadReport,
    GroupHealth,
    Report,
    Targets,
    final_progress,
    last_step_known,
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


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


def report(index: int = 0, step: int = 10, phase: str = "training", **fields: Any) -> Report:
    parsed = parse_report(body(raw(index, step, phase, **fields)), index, 0)
    assert isinstance(parsed, Report)
    return parsed


TARGETS = Targets(generation=0, port=8471, workers=((0, "10.88.0.5"), (1, "10.88.0.6")),
                  all_running=True, progress_timeout=20)


def polls(*rounds: tuple[float, dict[int, Report | BadReport | None]],
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
    assert r.updated is not None and r.updated.isoformat() == "2026-01-01T12:00:00.500000+00:00"


@pytest.mark.parametrize(("raw_body", "why"), [
    (b"", "Invalid JSON"), (b"not json", "Invalid JSON"), (b"[]", "should be an object"),
    (body({"workerIndex": 0}), "generation: Field required"),
    (body(raw(index=1)), "from worker-1 of generation 0, not worker-0"),
    (body(raw(generation=1)), "of generation 1, not worker-0 of generation 0"),
    (body({**raw(), "step": "many"}), "step: Input should be a valid integer"),
    (body({**raw(), "step": "12"}), "step: Input should be a valid integer"),  # strict types
    (body({**raw(), "deep": [[[[[[]]]]]] * 3}), None),  # extra keys are ignored...
    (b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}", "recursion limit"),  # ...but not unbounded
    (b" " * (MAX_REPORT_BYTES + 1), "larger than 64 KiB"),
], ids=["empty", "text", "list", "partial", "other worker", "other generation", "bad step",
        "string step", "extra keys", "deep nesting", "too large"])
def test_anything_else_is_a_bad_report_saying_why(raw_body: bytes, why: str | None) -> None:
    parsed = parse_report(raw_body, 0, 0)
    if why is None:
        assert isinstance(parsed, Report)
    else:
        assert isinstance(parsed, BadReport) and why in parsed.reason, parsed


def test_nan_loss_and_missing_times_are_dropped() -> None:
    r = parse_report(body(raw(loss=float("nan"), updatedAt=None, stepsPerSecond=None)), 0, 0)
    assert isinstance(r, Report) and (r.loss, r.updated, r.steps_per_second) == (None, None, None)


def test_bad_reports_are_counted_and_do_not_advance() -> None:
    health = polls((0, {0: report(step=5), 1: report(1, step=5)}),
                   (3, {0: BadReport("larger than 64 KiB"), 1: report(1, step=6)}))
    chief = health.workers[0]
    assert (chief.bad_reports, chief.last_bad, chief.answering) == (1, "larger than 64 KiB", False)
    assert chief.report is not None and chief.report.step == 5 and health.bad_reports == 1


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
    assert (chief.missed_polls, other.missed_polls) == (0, 1)


def test_unanswered_polls_are_counted_in_a_row() -> None:
    health = polls((0, {0: None}), (3, {0: BadReport("not JSON")}), (6, {0: None}))
    assert (health.workers[0].missed_polls, health.workers[0].silent_since) == (3, at(0))
    health = polls((0, {0: None}), (3, {0: report(step=1)}), (6, {0: None}))
    assert (health.workers[0].missed_polls, health.workers[0].silent_since) == (1, at(6))


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
    assert progress.expected_save_seconds is None  # not reported (yet): none
    assert progress_of(polls((0, {0: None, 1: report(1)}))) is None


def test_the_chiefs_expected_save_time_reaches_status() -> None:
    """The operator's grace for a broken group's survivors follows it
    (policy.survivor_save_grace)."""
    saving = report(step=63, expectedSaveSeconds=12.91)
    progress = progress_of(polls((0, {0: saving, 1: report(1, step=63)})))
    assert progress is not None and progress.expected_save_seconds == 12.91


@pytest.mark.parametrize(("phase", "step", "shown"), [
    ("starting", 0, False), ("waiting-for-peers", 0, False),  # not restored yet
    ("starting", 37, True),  # restored before its peers answered
    ("training", 0, True),  # a fresh job's first steps
])
def test_a_chief_not_yet_restored_does_not_read_as_resumed_from_zero(
        phase: str, step: int, shown: bool) -> None:
    """A resuming chief reports step 0 until its restore: status.progress keeps what it
    said (a bench read resumedFromStep 0 right after a resume at 37)."""
    progress = progress_of(polls((0, {0: report(step=step, phase=phase), 1: None})))
    assert (progress is not None) is shown


@pytest.mark.parametrize(("reported", "expected"),
                         [(0.96875, 0.96875), (None, None), (float("nan"), None)])
def test_accuracy_reaches_status_when_reported(reported: Any, expected: float | None) -> None:
    answer = report(accuracy=reported) if reported is not None else report()
    progress = progress_of(polls((0, {0: answer, 1: None})))
    assert progress is not None and progress.accuracy == expected


@pytest.mark.parametrize(("message", "step"), [
    ('final progress: {"workerIndex":0,"generation":1,"phase":"done","step":300}', 300),
    ('final progress: {"workerIndex":0,"generation":1,"phase":"done","step":-1}', None),
    ("final progress: not json", None),
    ('{"workerIndex":0,"generation":1,"phase":"done","step":300}', None),  # no prefix
    ("Traceback (most recent call last): ...", None),
])
def test_final_progress_is_read_only_from_a_well_formed_final_report(
    message: str, step: int | None,
) -> None:
    found = final_progress(message)
    assert (found.step if found else None) == step


@pytest.mark.parametrize(("reported", "messages", "last"), [
    (40, [], 40),
    (40, ["collective aborted; saved this survivor's state at step 47", ""], 47),
    (None, ["saved this survivor's state at step 12", "saved this survivor's state at step 13"],
     13),
    (None, ["exited 1"], None),
])
def test_the_last_step_known_is_the_chief_report_or_a_survivor_save(
    reported: int | None, messages: list[str], last: int | None
) -> None:
    assert last_step_known(reported, messages) == last
