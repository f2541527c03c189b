"""status.history's rules (decide/history.py): one record per generation, each field set once,
the last HISTORY_LIMIT kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from multiworker.api.status import HISTORY_LIMIT, HISTORY_MESSAGE_CHARS
from multiworker.decide import history

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_generation_is_opened_once_whoever_asks_again() -> None:
    records = history.began(None, 0, 3, "Created", T0)
    again = history.began(records, 0, 2, "Recreate", T0 + timedelta(seconds=5))
    assert [(r.generation, r.workers, r.path, r.started) for r in again] == \
        [(0, 3, "Created", T0)]


@pytest.mark.parametrize(("update", "field", "first", "second"), [
    (lambda h, v: history.ended(h, 0, v, "m", T0), "reason", "OOMKilled", "Evicted"),
    (lambda h, v: history.running(h, 0, 3, v), "running", T0, T0 + timedelta(seconds=9)),
    (lambda h, v: history.resumed(h, 0, v), "resumed_from_step", 40, 47),
    (lambda h, v: history.lost(h, 0, v), "steps_lost", 3, 0),
])
def test_each_field_keeps_its_first_value(update: Any, field: str, first: Any, second: Any) -> None:
    records = update(update(history.began(None, 0, 3, "Created", T0), first), second)
    assert getattr(records[0], field) == first


def test_a_field_is_set_only_on_the_generation_named() -> None:
    records = history.began(history.began(None, 0, 3, "Created", T0), 1, 3, "Recreate", T0)
    records = history.lost(records, 0, 5)
    assert [r.steps_lost for r in records] == [5, None]
    assert history.lost(records, 7, 1) == records  # unknown: nothing changes


@pytest.mark.parametrize(("path", "how", "expected"), [
    ("InPlace", "warm", "warm"),
    ("InPlace", "cold", "cold"),
    ("Recreate", "warm", None),  # only an in-place restart starts its trainer warm or cold
])
def test_the_trainer_start_belongs_to_in_place_restarts(path: Any, how: Any,
                                                       expected: str | None) -> None:
    records = history.trainer_started(history.began(None, 1, 2, path, T0), 1, how)
    assert records[0].trainer_start == expected


def test_the_last_generations_are_kept_and_long_messages_cut() -> None:
    records = None
    for generation in range(HISTORY_LIMIT + 5):
        records = history.ended(history.began(records, generation, 2, "Recreate", T0),
                                generation, "Error", "x" * 1000, T0)
    assert records is not None and len(records) == HISTORY_LIMIT
    assert records[0].generation == 5 and records[-1].generation == HISTORY_LIMIT + 4
    assert all(len(r.message or "") <= HISTORY_MESSAGE_CHARS for r in records)
