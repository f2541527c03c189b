"""The /progress endpoint the operator polls (stdlib only)."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from multiworker.runtime.progress import Phase, ProgressBoard, serve_progress

from tests.support import wait_for


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
        "expectedSaveSeconds": None,
        "updatedAt": None,
        "peers": [],
        "software": None,
    }


def test_progress_follows_training(board: tuple[ProgressBoard, int]) -> None:
    progress, port = board
    progress.restored(step=40, epoch=2)
    progress.set_phase(Phase.TRAINING)
    progress.step_done(41, 0.5)
    progress.step_done(42, 0.25, 0.875)
    progress.checkpointed(42)
    progress.expect_save(3.5)
    progress.expect_save(None)  # a worker other than the chief has no figure: kept
    progress.epoch_done(3)

    state = get(port)
    assert state["phase"] == "training"
    assert (state["step"], state["epoch"], state["loss"], state["accuracy"]) == (42, 3, 0.25, 0.875)
    assert (state["restoredFromStep"], state["lastCheckpointStep"]) == (40, 42)
    assert state["expectedSaveSeconds"] == 3.5
    assert isinstance(state["updatedAt"], float)
    assert isinstance(state["stepsPerSecond"], float) and state["stepsPerSecond"] > 0


def test_other_paths_are_not_found(board: tuple[ProgressBoard, int]) -> None:
    _, port = board
    with pytest.raises(urllib.error.HTTPError) as error:
        get(port, "/metrics")
    assert error.value.code == 404


def test_preflight_is_unavailable_until_a_report_is_published(
    board: tuple[ProgressBoard, int],
) -> None:
    progress, port = board
    with pytest.raises(urllib.error.HTTPError) as error:
        get(port, "/preflight")
    assert error.value.code == 503

    progress.serve_preflight(lambda query: {"asked": query})
    assert get(port, "/preflight?worker=1&generation=0") == {
        "asked": {"worker": ["1"], "generation": ["0"]}
    }


def test_progress_answers_on_ipv4_and_ipv6(board: tuple[ProgressBoard, int]) -> None:
    """One dual-stack socket (`::`, IPV6_V6ONLY off): IPv4 clients arrive as ::ffff:a.b.c.d."""
    _, port = board
    if not ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback (::1)")
    assert get(port)["workerIndex"] == 2
    with urllib.request.urlopen(f"http://[::1]:{port}/progress", timeout=5) as response:
        assert json.load(response)["workerIndex"] == 2


def test_two_requests_reuse_one_connection(board: tuple[ProgressBoard, int]) -> None:
    _, port = board
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        first = request(connection, "/progress")
        sock = connection.sock
        second = request(connection, "/preflight")  # an error status keeps it open too
        assert (first.status, second.status) == (200, 503)
        assert first.version == 11 and first.getheader("Connection") is None
        assert connection.sock is sock and sock is not None
        assert request(connection, "/progress").status == 200
        assert connection.sock is sock
    finally:
        connection.close()


def test_idle_connections_are_closed() -> None:
    server = serve_progress(ProgressBoard(0, 0), 0, idle_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as idle:
            assert idle.recv(1) == b""  # the server hung up; not our 10 s timeout
    finally:
        stop(server)


def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    server = serve_progress(ProgressBoard(0, 0), 0, max_connections=2)
    port = port_of(server)
    try:
        held = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(2)]
        for connection in held:
            assert request(connection, "/progress").status == 200  # both slots taken
        with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
            third.sendall(b"GET /progress HTTP/1.1\r\nHost: x\r\n\r\n")
            assert third.recv(1) == b""
        assert request(held[0], "/progress").status == 200  # the held ones still work
        held[1].close()
        assert wait_for(lambda: answers(port), timeout=10, interval=0.1)
        held[0].close()
    finally:
        stop(server)


def test_a_get_with_a_body_is_refused_and_closed(board: tuple[ProgressBoard, int]) -> None:
    _, port = board
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(
            b"GET /progress HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
            b"GET /x"
        )
        response = read_all(raw)
    assert response.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in response


def request(connection: http.client.HTTPConnection, path: str) -> http.client.HTTPResponse:
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    return response


def answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        return request(connection, "/progress").status == 200
    except OSError:
        return False
    finally:
        connection.close()


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def port_of(server: ThreadingHTTPServer) -> int:
    port: int = server.server_address[1]
    return port


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()
