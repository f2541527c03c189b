"""Waiting for the other workers at start, with a deadline and periodic lines per missing peer.

The chicken-and-egg: a worker's TF gRPC server starts listening only inside the MWMS
constructor, and that constructor then blocks (holding the GIL, so no Python thread can even
log) until every worker has registered with the coordination service on worker 0. Waiting for
*all* peers' ports before constructing would deadlock: everyone waits for ports nobody opens.
What can be waited for safely, in Python, with logs and a deadline:

1. every peer's DNS name resolves: the Kubernetes race, a headless Service publishes a pod's
   record only some time after the pod starts;
2. on workers other than 0: worker 0's port accepts TCP, since registering needs it, and
   worker 0 opens it without waiting for anyone.

The rest (the others registering with worker 0) happens inside the constructor, bounded by the
same timeout through TF's registration barrier (see `strategy.make_strategy`).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence

from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import PeersUnreachable
from multiworker.runtime.progress import Phase

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
LOG_EVERY_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 1.0
TIMEOUT_VARIABLE = "MWJ_PEER_TIMEOUT_SECONDS"


def wait_for_peers(context: WorkerContext) -> None:
    """Blocks until peers' names resolve and, off worker 0, worker 0 accepts connections.

    Raises PeersUnreachable (exit 3) naming the missing peers after MWJ_PEER_TIMEOUT_SECONDS.
    """
    config = context.config
    if config.is_standalone:
        return
    context.progress.set_phase(Phase.WAITING_FOR_PEERS)
    timeout = config.peer_timeout_seconds
    deadline = time.monotonic() + timeout
    others = [peer for i, peer in enumerate(config.peers) if i != config.worker_index]
    unresolved = wait_until(others, resolves, deadline, "name does not resolve yet")
    if unresolved:
        raise PeersUnreachable(
            f"peers not resolvable after {timeout:g}s ({TIMEOUT_VARIABLE}): {', '.join(unresolved)}"
        )
    leader = [] if config.is_chief else [config.peers[0]]
    closed = wait_until(leader, accepts_tcp, deadline, "port not accepting connections yet")
    if closed:
        raise PeersUnreachable(
            f"peers not accepting connections after {timeout:g}s ({TIMEOUT_VARIABLE}): "
            f"{', '.join(closed)}"
        )
    log.info("peers resolve%s", "" if config.is_chief else f"; worker 0 at {config.peers[0]} is up")


def wait_until(
    peers: Sequence[str], ready: Callable[[str], bool], deadline: float, what: str
) -> list[str]:
    """Polls `ready` for each peer until all are ready or `deadline` (monotonic) passes.

    Returns the peers still not ready; logs each of them every LOG_EVERY_SECONDS meanwhile."""
    next_log = time.monotonic() + LOG_EVERY_SECONDS
    missing = [peer for peer in peers if not ready(peer)]
    while missing and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
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
