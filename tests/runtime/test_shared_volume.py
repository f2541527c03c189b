"""The shared-volume markers (shared_volume.py) without TensorFlow: where they go, how long a
worker looks for them, and the words that name an unshared checkpoint directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from multiworker.runtime import shared_volume
from multiworker.runtime.shared_volume import (
    POLL_SECONDS,
    marker_nodes,
    remove_older_markers,
    unseen_markers,
    unshared_message,
    wait_for_markers,
    write_marker,
)

TAIL = ("; it must be storage every worker shares (ReadWriteMany; on kind, the folder every "
        "node mounts), not node-local")


class FakeTime:
    """A clock that advances only when slept on, running `on_sleep` at each sleep."""

    def __init__(self, on_sleep: Callable[[int], object] | None = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.on_sleep is not None:
            self.on_sleep(self.sleeps)


def test_a_marker_names_the_worker_its_node_and_pod(tmp_path: Path) -> None:
    write_marker(str(tmp_path), 3, 1, "node-b", "job-worker-1")
    folder = tmp_path / "markers" / "g3"
    assert [p.name for p in folder.iterdir()] == ["worker-1.json"]  # no temp left
    assert json.loads((folder / "worker-1.json").read_text()) == {
        "worker": 1, "node": "node-b", "pod": "job-worker-1"}
    write_marker(str(tmp_path), 3, 0, None, "job-worker-0")
    assert json.loads((folder / "worker-0.json").read_text())["node"] is None
    assert marker_nodes(str(tmp_path), 3, [0, 1, 2]) == {1: "node-b"}


def test_every_marker_visible_returns_at_once(tmp_path: Path) -> None:
    for worker in range(3):
        write_marker(str(tmp_path), 0, worker, None, "pod")
    time = FakeTime()
    assert wait_for_markers(str(tmp_path), 0, 3, 15.0, time.clock, time.sleep) == []
    assert time.sleeps == 0


def test_a_marker_that_shows_up_late_is_waited_for(tmp_path: Path) -> None:
    write_marker(str(tmp_path), 0, 0, None, "pod")
    time = FakeTime(lambda n: n == 8 and write_marker(str(tmp_path), 0, 1, None, "pod"))
    assert wait_for_markers(str(tmp_path), 0, 2, 15.0, time.clock, time.sleep) == []
    assert time.sleeps == 8


def test_markers_never_seen_are_returned_after_the_wait(tmp_path: Path) -> None:
    write_marker(str(tmp_path), 1, 1, None, "pod")
    write_marker(str(tmp_path), 0, 2, None, "pod")  # an earlier generation's does not count
    time = FakeTime()
    assert wait_for_markers(str(tmp_path), 1, 3, 15.0, time.clock, time.sleep) == [0, 2]
    assert time.sleeps == int(15.0 / POLL_SECONDS)


def test_a_stale_listing_does_not_hide_a_marker_that_opens_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_marker(str(tmp_path), 0, 0, None, "pod")
    monkeypatch.setattr(shared_volume.os, "listdir", lambda _: [])
    assert unseen_markers(str(tmp_path), 0, [0, 1]) == [1]


def test_the_chief_removes_only_earlier_generations(tmp_path: Path) -> None:
    for generation in (0, 1, 2, 3):
        write_marker(str(tmp_path), generation, 0, None, "pod")
    (tmp_path / "markers" / "notes").mkdir()
    remove_older_markers(str(tmp_path), 2)
    assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == ["g2", "g3", "notes"]
    remove_older_markers(str(tmp_path / "absent"), 2)  # best effort: nothing to remove


def test_a_worker_that_cannot_see_names_what_it_misses_and_its_node() -> None:
    assert unshared_message("/ckpt/ns/job-uid", 0, "kind-worker", [2, 3], [0], {}, 15) == (
        "MWJ_CHECKPOINT_DIR /ckpt/ns/job-uid is not shared by all workers: worker-0 (node "
        "kind-worker) cannot see what worker-2, worker-3 wrote there within 15s" + TAIL)


def test_a_worker_that_sees_every_marker_names_those_that_do_not() -> None:
    message = unshared_message("/d", 1, None, [], [0, 2], {0: "node-a"}, 7.5)
    assert message == (
        "MWJ_CHECKPOINT_DIR /d is not shared by all workers: worker-1 sees every worker's "
        "marker there, but 2 worker(s) do not within 7.5s: worker-0 (node node-a), worker-2"
        + TAIL)


def test_long_lists_are_cut_and_counted() -> None:
    message = unshared_message("/d", 0, None, list(range(1, 21)), [0], {}, 15)
    assert "worker-1, worker-2, worker-3, worker-4, worker-5, worker-6, worker-7, worker-8 " \
           "and 12 more wrote there" in message
