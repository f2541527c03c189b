"""Waiting for the other workers at start, with a deadline and one log line per missing peer.

Why two phases. Each worker's TF gRPC server starts listening only inside the MWMS constructor,
and that constructor blocks until every worker has registered with the coordination service on
worker 0. Waiting for peers' ports *before* constructing the strategy would therefore deadlock
(everyone waits for ports nobody opens). So:

1. `wait_for_peers` (before the strategy): every peer's DNS name resolves. This is the
   Kubernetes race: a headless Service publishes a pod's record only some time after the pod
   starts, and gRPC would otherwise fail or back off on unresolvable names.
2. `PeerWatch` (around the MWMS constructor, see `strategy.make_strategy`): a thread probes each
   peer's port over TCP, logs the ones not yet accepting, and ends the process with exit 3 at
   the deadline. It must exit from the thread: the constructor blocks in C++ and, on worker 0,
   TF waits for missing workers forever (measured with cluster_register_timeout set).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import ExitCode, PeersUnreachable
from multiworker.runtime.exits import exit_now
from multiworker.runtime.progress import Phase

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
LOG_EVERY_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 1.0


def wait_for_peers(context: WorkerContext) -> None:
    """Blocks until every other worker's DNS name resolves; PeersUnreachable (exit 3) on timeout."""
    config = context.config
    if config.is_standalone:
        return
    context.progress.set_phase(Phase.WAITING_FOR_PEERS)
    others = other_peers(config.peers, config.worker_index)
    deadline = time.monotonic() + config.peer_timeout_seconds
    missing = wait_until(others, resolves, deadline, "DNS name unresolved", threading.Event())
    if missing:
        raise PeersUnreachable(
            f"peers not resolvable after {config.peer_timeout_seconds:g}s "
            f"(MWJ_PEER_TIMEOUT_SECONDS): {', '.join(missing)}"
        )
    log.info("all %d peers resolve", len(others))


def other_peers(peers: Sequence[str], worker_index: int) -> list[str]:
    return [peer for i, peer in enumerate(peers) if i != worker_index]


def wait_until(
    peers: Sequence[str],
    ready: Callable[[str], bool],
    deadline: float,
    what: str,
    stopped: threading.Event,
) -> list[str]:
    """Polls `ready` for each peer until all are ready, `deadline` (monotonic) passes, or
    `stopped` is set. Returns the peers still not ready; logs them every LOG_EVERY_SECONDS."""
    next_log = time.monotonic() + LOG_EVERY_SECONDS
    missing = [peer for peer in peers if not ready(peer)]
    while missing and time.monotonic() < deadline:
        if stopped.wait(POLL_SECONDS):
            return []
        if time.monotonic() >= next_log:
            for peer in missing:
                log.info("waiting for peer %s: %s", peer, what)
            next_log += LOG_EVERY_SECONDS
        missing = [peer for peer in missing if not ready(peer)]
    return missing


def resolves(peer: str) -> bool:
    host = peer.rpartition(":")[0]
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def accepts_tcp(peer: str) -> bool:
    host, _, port = peer.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError:
        return False
    return True


class PeerWatch:
    """While active, a thread waits for peers' ports and exits the process with 3 at the deadline.

    Used around the blocking MWMS constructor; leaving the `with` block stops the watch.
    """

    def __init__(self, context: WorkerContext) -> None:
        self._config = context.config
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)

    def __enter__(self) -> PeerWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        config = self._config
        others = other_peers(config.peers, config.worker_index)
        timeout = config.peer_timeout_seconds
        deadline = time.monotonic() + timeout
        missing = wait_until(others, accepts_tcp, deadline, "port not accepting", self._stopped)
        if missing:
            log.error(
                "peers not accepting connections after %gs (MWJ_PEER_TIMEOUT_SECONDS): %s",
                timeout,
                ", ".join(missing),
            )
            exit_now(ExitCode.PEERS_UNREACHABLE)
        if self._stopped.wait(max(0.0, deadline - time.monotonic())):
            return
        log.error(
            "peers accept connections but the group did not form within %gs "
            "(MWJ_PEER_TIMEOUT_SECONDS): %s",
            timeout,
            ", ".join(others),
        )
        exit_now(ExitCode.PEERS_UNREACHABLE)
