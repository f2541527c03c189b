"""A starting worker tells apart why a peer is missing — its name does not resolve, its port
refuses (not listening yet), or nothing answers (packets dropped: a firewall or NetworkPolicy)
— says so early in its log and /progress, and names each with its state when it exits 3.

The dropped port is real and deterministic without root: a listening socket whose accept
queue is full (backlog 0, one connection never accepted). Linux then drops every further SYN
(tcp_conn_request: "sk_acceptq_is_full -> drop"), so a client sees exactly what a DROP rule
gives it: no SYN-ACK, no RST, a connect that times out.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from multiworker.runtime.peers import poll_seconds
from multiworker.runtime.reach import (
    DROPPED_AFTER,
    Endpoint,
    Reach,
    Unanswered,
    connect,
    get_json,
)

from tests.runtime.workers import Launcher
from tests.support import free_port, free_ports, wait_for

UNRESOLVABLE = "no-such-worker.invalid"
PEER_TIMEOUT = 45


@pytest.fixture
def dropping_port() -> Iterator[int]:
    """A loopback port that silently drops new connections (see the module docstring)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # fills the queue
            yield port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts TCP connections (the kernel completes them) but never answers a request."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port: int = listener.getsockname()[1]
        yield port


def outcome(host: str, port: int, timeout: float = 1.0) -> Reach:
    with pytest.raises(Unanswered) as failure:
        connect(host, port, timeout).close()
    return failure.value.reach


def test_probes_tell_unresolved_refused_and_no_answer_apart(dropping_port: int) -> None:
    assert outcome(UNRESOLVABLE, 2222) is Reach.UNRESOLVED
    assert outcome("127.0.0.1", free_port()) is Reach.REFUSED
    assert outcome("127.0.0.1", dropping_port) is Reach.CONNECTING


def test_a_server_that_accepts_but_never_answers_is_silent(silent_port: int) -> None:
    with pytest.raises(Unanswered) as failure:
        get_json("127.0.0.1", silent_port, "/preflight", timeout=0.5)
    assert failure.value.reach is Reach.SILENT


def test_repeated_timeouts_become_dropped_once() -> None:
    endpoint = Endpoint(worker=0, kind="tensorflow", host="10.0.0.5", port=2222)
    became = [endpoint.record(Reach.CONNECTING, "no answer") for _ in range(DROPPED_AFTER + 1)]
    assert became == [False] * (DROPPED_AFTER - 1) + [True, False]
    assert endpoint.reach is Reach.DROPPED
    assert endpoint.describe() == (
        f"worker-0 (10.0.0.5:2222, TensorFlow port): no answer after {DROPPED_AFTER + 1} "
        "attempts: packets are dropped, likely a firewall or NetworkPolicy blocking port 2222"
    )
    assert endpoint.record(Reach.REFUSED, "connection refused (not listening yet)") is False
    assert endpoint.record(Reach.CONNECTING, "no answer") is False  # counting starts over
    assert endpoint.reach is Reach.CONNECTING


@pytest.mark.timeout(120)
def test_a_waiting_worker_reports_each_peer_state_and_exits_3_naming_them(
    launcher: Launcher, dropping_port: int, report: Any
) -> None:
    """Worker 1 of 3: worker 0's TensorFlow port drops, its progress port refuses, worker 2's
    name does not resolve. The drop shows in /progress after about DROPPED_AFTER x 5 s, before
    the peer timeout, and the exit names all three. The timeout counts from the worker's start,
    so it also covers the preflight's TensorFlow import: 45 s, for a loaded CI machine, where
    that import alone has taken more than 15 s."""
    refusing, own, own_progress, unresolvable_progress = free_ports(4)
    peers = [f"127.0.0.1:{dropping_port}", f"localhost:{own}", f"{UNRESOLVABLE}:2222"]
    (worker,) = launcher.start(
        3,
        only=(1,),
        peers=peers,
        progress_ports=[refusing, own_progress, unresolvable_progress],
        env={"MWJ_PEER_TIMEOUT_SECONDS": str(PEER_TIMEOUT)},
    )

    waiting = wait_for(
        lambda: dropped_report(worker.progress()),
        timeout=PEER_TIMEOUT - 2,
        interval=0.5,
        describe=launcher.logs,
    )
    code = worker.wait(timeout=60)

    states = {(p["worker"], p["endpoint"]): p["state"] for p in waiting["peers"]}
    assert waiting["phase"] == "waiting-for-peers"
    assert states == {
        (0, "tensorflow"): "dropped",
        (0, "progress"): "refused",
        (2, "name"): "unresolved",
    }
    assert code == 3, launcher.logs()
    log = worker.log()
    dropped = (
        re.escape(f"worker-0 (127.0.0.1:{dropping_port}, TensorFlow port): no answer after ")
        + r"\d+"
        + re.escape(
            " attempts: packets are dropped, likely a firewall or NetworkPolicy blocking "
            f"port {dropping_port}"
        )
    )
    assert re.search(f"WARNING .*{dropped}; still waiting, up to {PEER_TIMEOUT}s", log), log
    final = log.strip().splitlines()[-1]
    assert f"peers not reachable after {PEER_TIMEOUT}s (MWJ_PEER_TIMEOUT_SECONDS): " in final
    assert f"worker-2 ({UNRESOLVABLE}:2222): name does not resolve" in final
    assert (
        f"worker-0 (127.0.0.1:{refusing}, progress port): connection refused "
        "(not listening yet)" in final
    )
    assert re.search(dropped, final) and final.endswith("(exit 3)"), final
    report(f"dropped port reported {waiting_since(waiting):.0f}s after the wait started")


def dropped_report(progress: dict[str, Any] | None) -> dict[str, Any] | None:
    if progress and any(p["state"] == "dropped" for p in progress["peers"]):
        return progress
    return None


def waiting_since(progress: dict[str, Any]) -> float:
    """From the oldest state change to the drop (both the worker's unix times)."""
    since = {p["state"]: p["since"] for p in progress["peers"]}
    return float(since["dropped"] - min(since.values()))


@pytest.mark.parametrize(("workers", "seconds"), [
    (1, 0.05), (3, 0.05), (6, 0.05), (16, 0.125), (64, 0.5), (1024, 0.5)])
def test_small_groups_probe_often_and_large_ones_keep_worker_0_near_128_probes_a_second(
    workers: int, seconds: float
) -> None:
    """Each stage of the wait ends up to one interval late: 0.5 s cost a 3-worker restart
    about a second. What worker 0's port answers stays near workers / interval."""
    assert poll_seconds(workers) == pytest.approx(seconds)
    assert (workers - 1) / poll_seconds(workers) <= max(128, 2 * workers)
