"""The /progress endpoint the operator polls (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from multiworker.runtime.progress import Phase, ProgressBoard, serve_progress


@pytest.fixture
def board() -> Iterator[tuple[ProgressBoard, int]]:
    board = ProgressBoard(worker_index=2, generation=1)
    server = serve_progress(board, 0)
    yield board, server.server_address[1]
    server.shutdown()
    server.server_close()


def get(port: int, path: str = "/progress") -> dict[str, object]:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}{path}", timeout=5
    ) as response:
        assert response.headers["Content-Type"] == "application/json"
        body: dict[str, object] = json.load(response)
        return body


def test_progress_reports_the_contract_fields(board: tuple[ProgressBoard, int]) -> None:
    _, port = board
    assert get(port) == {
        "workerIndex": 2,
        "generation": 1,
        "phase": "starting",
        "step": 0,
        "epoch": 0,
        "stepsPerSecond": 0.0,
        "loss": None,
        "accuracy": None,
        "lastCheckpointStep": 0,
        "restoredFromStep": 0,
        "updatedAt": None,
    }


def test_progress_follows_training(board: tuple[ProgressBoard, int]) -> None:
    progress, port = board
    progress.restored(step=40, epoch=2)
    progress.set_phase(Phase.TRAINING)
    progress.step_done(41, 0.5)
    progress.step_done(42, 0.25, 0.875)
    progress.checkpointed(42)
    progress.epoch_done(3)

    state = get(port)
    assert state["phase"] == "training"
    assert (state["step"], state["epoch"], state["loss"], state["accuracy"]) == (42, 3, 0.25, 0.875)
    assert (state["restoredFromStep"], state["lastCheckpointStep"]) == (40, 42)
    assert isinstance(state["updatedAt"], float)
    assert isinstance(state["stepsPerSecond"], float) and state["stepsPerSecond"] > 0


def test_other_paths_are_not_found(board: tuple[ProgressBoard, int]) -> None:
    _, port = board
    with pytest.raises(urllib.error.HTTPError) as error:
        get(port, "/metrics")
    assert error.value.code == 404
