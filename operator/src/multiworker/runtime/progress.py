"""The progress report the operator polls: GET /progress on MWJ_PROGRESS_PORT (JSON, camelCase).

Pull over HTTP needs no credentials in the pod, and a stopped or wedged worker simply stops
answering, which is itself the hang signal (docs/contracts.md). The board is updated by the
training thread and read by the server thread, hence the lock.

`step` counts optimizer steps since the job's first generation (it survives restarts with the
checkpoint), `epoch` counts completed epochs, `accuracy` is the model's training
`accuracy` metric when it compiles one (else null), `restoredFromStep` is 0 unless this generation
resumed from a checkpoint, `stepsPerSecond` covers the last 20 steps, `updatedAt` is the unix
time of the last step (null before the first). `expectedSaveSeconds` (the chief's, after its
first step) is how long writing the state once takes on the checkpoint volume, which the
operator gives a broken group's survivors twice over to save it. `peers` lists the peer
endpoints a starting worker still waits for and their state (peers.py), `software` what this
worker runs, once its preflight started (preflight.py); GET /preflight serves that
preflight's report.
"""

from __future__ import annotations

import collections
import enum
import errno
import json
import logging
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from multiworker.api.contract import PREFLIGHT_PATH, PROGRESS_PATH

log = logging.getLogger(__name__)

_RATE_WINDOW = 20  # steps/s is measured over this many recent steps
# The operator polls every 3 s over keep-alive connections; peers poll during the preflight.
IDLE_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 64
_NO_IPV6 = {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT}

# What GET /preflight answers (query parameters in, JSON out); None: 503, not ready yet.
PreflightSource = Callable[[Mapping[str, list[str]]], Mapping[str, Any] | None]


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
            "expectedSaveSeconds": None,
            "updatedAt": None,
            "peers": [],
            "software": None,
        }
        self._preflight: PreflightSource | None = None
        self._peers_checked = False

    def set_phase(self, phase: Phase) -> None:
        self._update(phase=phase.value)

    def restored(self, step: int, epoch: int, origin: str = "checkpoint") -> None:
        """Resuming at `step` (that checkpoint exists, so it is also the last checkpoint),
        restored from `origin` (a checkpoint, or a survivor's save)."""
        self._update(step=step, epoch=epoch, restoredFromStep=step, lastCheckpointStep=step,
                     restoredFrom=origin)

    def survivor_saved(self, step: int, seconds: float, bytes_written: int = 0) -> None:
        """A peer failed and the survivors saved a copy of the state at `step`, this worker
        `bytes_written` of it (survivors.py)."""
        self._update(survivorSave={"step": step, "seconds": seconds, "bytes": bytes_written})

    def expect_save(self, seconds: float | None) -> None:
        """How long writing the state once takes (checkpoint.CheckpointStore); None: not
        known here (a worker other than the chief)."""
        if seconds is not None:
            self._update(expectedSaveSeconds=seconds)

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

    def waiting_for(self, peers: list[dict[str, Any]]) -> None:
        """The peer endpoints this worker still waits for, each with its state (peers.py)."""
        self._update(peers=peers)

    def set_software(self, software: Mapping[str, Any]) -> None:
        """The image-relevant part of this worker's fingerprint (preflight.py)."""
        self._update(software=dict(software))

    def serve_preflight(self, source: PreflightSource) -> None:
        with self._lock:
            self._preflight = source

    def preflight(self, query: Mapping[str, list[str]]) -> Mapping[str, Any] | None:
        with self._lock:
            source = self._preflight
        return None if source is None else source(query)

    @property
    def peers_checked(self) -> bool:
        """`wait_for_peers` has succeeded (it runs once, whoever calls it)."""
        return self._peers_checked

    def mark_peers_checked(self) -> None:
        self._peers_checked = True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def _update(self, **fields: Any) -> None:
        with self._lock:
            self._state.update(fields)

    def _rate(self) -> float:
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else 0.0


def serve_progress(
    board: ProgressBoard,
    port: int,
    *,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
) -> ThreadingHTTPServer:
    """Serves the board on all interfaces, IPv6 and IPv4, from a daemon thread.

    HTTP/1.1 with keep-alive, so a poller can reuse its connection; a connection idle for
    `idle_timeout` is closed, and beyond `max_connections` new ones are closed at once, so a
    misbehaving client cannot take the worker's threads.
    """
    handler = _handler_for(board, idle_timeout)
    server = _bind(port, handler, max_connections)
    threading.Thread(target=server.serve_forever, name="progress-http", daemon=True).start()
    family = "IPv6 and IPv4" if server.address_family == socket.AF_INET6 else "IPv4 only"
    log.info("serving progress on :%d%s (%s)", server.server_address[1], PROGRESS_PATH, family)
    return server


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them; dual-stack when IPv6."""

    daemon_threads = True
    block_on_close = False  # idle keep-alive threads must not delay shutdown

    def __init__(
        self, family: socket.AddressFamily, port: int, handler: type[BaseHTTPRequestHandler],
        max_connections: int,
    ) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(("::" if family == socket.AF_INET6 else "0.0.0.0", port), handler)

    def server_bind(self) -> None:
        """Accepts IPv4 too on an IPv6 socket; skips HTTPServer's reverse DNS lookup."""
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: close instead of queueing
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _bind(
    port: int, handler: type[BaseHTTPRequestHandler], max_connections: int
) -> ThreadingHTTPServer:
    """`::` with IPV6_V6ONLY off (IPv6 and IPv4 pods alike); 0.0.0.0 where IPv6 is off."""
    if socket.has_ipv6:
        try:
            return _BoundedServer(socket.AF_INET6, port, handler, max_connections)
        except OSError as e:
            if e.errno not in _NO_IPV6:
                raise
            log.info("IPv6 is not available (%s): progress is served on IPv4 only", e)
    return _BoundedServer(socket.AF_INET, port, handler, max_connections)


def _handler_for(board: ProgressBoard, idle_timeout: float) -> type[BaseHTTPRequestHandler]:
    class ProgressHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length
        timeout = idle_timeout  # per read: an idle or trickling connection is closed

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            has_body = self.headers.get("Content-Length", "0") != "0"
            if has_body or "Transfer-Encoding" in self.headers:
                self.close_connection = True  # an unread body would be parsed as a request
                self._send(400, {"error": "GET takes no body"})
                return
            path, _, query = self.path.partition("?")
            if path == PROGRESS_PATH:
                self._send(200, board.snapshot())
            elif path == PREFLIGHT_PATH:
                report = board.preflight(urllib.parse.parse_qs(query))
                if report is None:
                    self._send(503, {"error": "no preflight report yet"})
                else:
                    self._send(200, report)
            else:
                self._send(404, {"error": f"only {PROGRESS_PATH} and {PREFLIGHT_PATH} are served"})

        def _send(self, status: int, document: Mapping[str, Any]) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """The operator polls every few seconds; a line per request would drown the log."""

    return ProgressHandler
