"""The progress report the operator polls: GET /progress on MWJ_PROGRESS_PORT (JSON, camelCase).

Pull over HTTP needs no credentials in the pod, and a stopped or wedged worker simply stops
answering, which is itself the hang signal (docs/contracts.md). The board is updated by the
training thread and read by the server thread, hence the lock.

`step` counts optimizer steps since the job's first generation (it survives restarts with the
checkpoint), `epoch` counts completed epochs, `accuracy` is the model's training
`accuracy` metric when it compiles one (else null), `restoredFromStep` is 0 unless this generation
resumed from a checkpoint, `stepsPerSecond` covers the last 20 steps, `updatedAt` is the unix
time of the last step (null before the first).
"""

from __future__ import annotations

import collections
import enum
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

PATH = "/progress"
_RATE_WINDOW = 20  # steps/s is measured over this many recent steps


class Phase(enum.StrEnum):
    STARTING = "starting"
    WAITING_FOR_PEERS = "waiting-for-peers"
    TRAINING = "training"
    DONE = "done"
    FAILED = "failed"


class ProgressBoard:
    """The latest progress of this worker; `snapshot()` is the JSON body of GET /progress."""

    def __init__(self, worker_index: int, generation: int) -> None:
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=_RATE_WINDOW)
        self._state: dict[str, Any] = {
            "workerIndex": worker_index,
            "generation": generation,
            "phase": Phase.STARTING.value,
            "step": 0,
            "epoch": 0,
            "stepsPerSecond": 0.0,
            "loss": None,
            "accuracy": None,
            "lastCheckpointStep": 0,
            "restoredFromStep": 0,
            "updatedAt": None,
        }

    def set_phase(self, phase: Phase) -> None:
        self._update(phase=phase.value)

    def restored(self, step: int, epoch: int) -> None:
        """Resuming at `step` (that checkpoint exists, so it is also the last checkpoint)."""
        self._update(step=step, epoch=epoch, restoredFromStep=step, lastCheckpointStep=step)

    def step_done(self, step: int, loss: float | None, accuracy: float | None = None) -> None:
        now = time.time()
        with self._lock:
            self._recent.append((now, step))
            self._state.update(step=step, loss=loss, accuracy=accuracy, updatedAt=now,
                               stepsPerSecond=self._rate())

    def epoch_done(self, epochs_completed: int) -> None:
        self._update(epoch=epochs_completed)

    def checkpointed(self, step: int) -> None:
        self._update(lastCheckpointStep=step)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def _update(self, **fields: Any) -> None:
        with self._lock:
            self._state.update(fields)

    def _rate(self) -> float:
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else 0.0


def serve_progress(board: ProgressBoard, port: int) -> ThreadingHTTPServer:
    """Serves the board on all interfaces from a daemon thread; returns the bound server."""
    server = ThreadingHTTPServer(("", port), _handler_for(board))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="progress-http", daemon=True).start()
    log.info("serving progress on :%d%s", server.server_address[1], PATH)
    return server


def _handler_for(board: ProgressBoard) -> type[BaseHTTPRequestHandler]:
    class ProgressHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?", 1)[0] != PATH:
                self.send_error(404, f"only {PATH} is served")
                return
            body = json.dumps(board.snapshot()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """The operator polls every few seconds; a line per request would drown the log."""

    return ProgressHandler
