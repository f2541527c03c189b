from __future__ import annotations

from multiworker.api.conditions import MESSAGE_LIMIT, Type, find, is_true, set_condition

from tests.unit.builders import at


def test_transition_time_kept_unless_status_flips() -> None:
    conditions = set_condition([], Type.RUNNING, "False", "WorkersPending", "waiting", at(0))
    conditions = set_condition(conditions, Type.RUNNING, "False", "WorkersStarting", "pull", at(5))
    running = find(conditions, Type.RUNNING)
    assert running is not None
    assert running.last_transition_time == at(0)
    assert (running.reason, running.message) == ("WorkersStarting", "pull")
    conditions = set_condition(conditions, Type.RUNNING, "True", "AllWorkersRunning", "ok", at(9))
    running = find(conditions, Type.RUNNING)
    assert running is not None and running.last_transition_time == at(9)


def test_running_and_restarting_replace_each_other() -> None:
    conditions = set_condition([], Type.RUNNING, "True", "AllWorkersRunning", "", at(0))
    conditions = set_condition(conditions, Type.RESTARTING, "True", "WorkerFailed", "w2", at(1))
    assert is_true(conditions, Type.RESTARTING) and not is_true(conditions, Type.RUNNING)
    running = find(conditions, Type.RUNNING)
    assert running is not None and running.reason == "WorkerFailed"
    conditions = set_condition(conditions, Type.RUNNING, "True", "AllWorkersRunning", "", at(2))
    assert is_true(conditions, Type.RUNNING) and not is_true(conditions, Type.RESTARTING)


def test_terminal_conditions_switch_running_off() -> None:
    for terminal in (Type.SUCCEEDED, Type.FAILED, Type.SUSPENDED):
        conditions = set_condition([], Type.RUNNING, "True", "AllWorkersRunning", "", at(0))
        conditions = set_condition(conditions, terminal, "True", "Why", "what", at(1))
        assert [c.type for c in conditions] == [Type.RUNNING, terminal]
        assert not is_true(conditions, Type.RUNNING)


def test_absent_conditions_are_not_added_by_exclusion() -> None:
    conditions = set_condition([], Type.SUCCEEDED, "True", "ChiefSucceeded", "", at(0))
    assert [c.type for c in conditions] == [Type.SUCCEEDED]


def test_input_is_not_modified() -> None:
    original = set_condition([], Type.RUNNING, "True", "AllWorkersRunning", "", at(0))
    set_condition(original, Type.FAILED, "True", "RestartLimitExceeded", "", at(1))
    assert is_true(original, Type.RUNNING) and len(original) == 1


def test_a_condition_message_is_bounded_and_says_it_was_cut() -> None:
    long = "x" * 5000
    [condition] = set_condition([], Type.RUNNING, "False", "Unschedulable", long, at(0))
    assert len(condition.message) == MESSAGE_LIMIT
    assert condition.message.endswith(" ... (cut here)")
    [short] = set_condition([], Type.RUNNING, "False", "Unschedulable", "fits", at(0))
    assert short.message == "fits"
