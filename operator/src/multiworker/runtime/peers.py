"""Waiting for the other workers at start: names, the preflight, worker 0's port; with a
deadline, a state per peer endpoint (GET /progress `peers`) and an early word on dropped ports.

The chicken-and-egg: a worker's TF gRPC server starts listening only inside the MWMS
constructor, and that constructor then blocks (holding the GIL, so no Python thread can even
log) until every worker has registered with the coordination service on worker 0. Waiting for
*all* peers' ports before constructing would deadlock: everyone waits for ports nobody opens.
What can be waited for safely, in Python, with logs and a deadline:

1. every peer's DNS name resolves: the Kubernetes race, a headless Service publishes a pod's
   record only some time after the pod starts;
2. the preflight (preflight.py) over the progress ports: worker 0 collects every fingerprint,
   the others wait for its verdict;
3. on workers other than 0: worker 0's port accepts TCP, since registering needs it, and
   worker 0 opens it (in the constructor) right after the preflight.

Each endpoint is probed every poll_seconds and told apart by reach.py: unresolved, refused
(not listening yet: normal early on), dropped (no answer DROPPED_AFTER times: a firewall or
NetworkPolicy, logged as a warning at once while the wait goes on). At the deadline the exit 3
message names every endpoint still missing with its state. The rest (the others registering
with worker 0) happens inside the constructor, bounded by the same timeout (strategy.py).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from multiworker.api.contract import MWJ_PEER_TIMEOUT_SECONDS, MWJ_PROGRESS_PORT, PREFLIGHT_PATH
from multiworker.runtime.config import RuntimeConfig, host_and_port
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import ConfigError, PeersUnreachable
from multiworker.runtime.preflight import GroupCheck
from multiworker.runtime.progress import Phase, ProgressBoard
from multiworker.runtime.reach import (
    PROBE_TIMEOUT_SECONDS,
    Endpoint,
    Reach,
    Unanswered,
    accepts,
    get_json,
)

log = logging.getLogger(__name__)

# How often a waiting worker probes what it waits for: a group waits in stages (the chief for
# every fingerprint, the others for its verdict, then for its port), and each stage ends up
# to one interval after it could: at 0.5 s, peers and strategy took 3.0 s of a 3-worker
# restart (0.4 s at 0.05 s, bench_in_place.py). So small groups probe often; from 64 workers
# on every 0.5 s, which keeps what worker 0 answers (every other worker probes its progress
# port) near 128 requests a second.
POLL_SECONDS_PER_WORKER = 1 / 128
MIN_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 0.5
LOG_EVERY_SECONDS = 10.0
FAILED_LINGER_SECONDS = 10.0  # worker 0 keeps serving a failed verdict this long at most
MAX_REPORTED = 16  # endpoints listed in GET /progress `peers`, the most telling first
_PARALLEL_PROBES = 16
_SEVERITY = [Reach.DROPPED, Reach.UNREACHABLE, Reach.UNRESOLVED, Reach.SILENT, Reach.REFUSED,
             Reach.CONNECTING, Reach.NOT_READY]

Probe = Callable[[Endpoint, float], tuple[Reach, str]]


def wait_for_peers(context: WorkerContext) -> None:
    """Blocks until peers' names resolve, the preflight passed and, off worker 0, worker 0
    accepts connections. Idempotent; `make_strategy` calls it when the script did not.

    Raises ConfigError (exit 2) naming the first way a worker differs from worker 0, and
    PeersUnreachable (exit 3) naming each missing peer and how, after MWJ_PEER_TIMEOUT_SECONDS.
    """
    config, board = context.config, context.progress
    if config.is_standalone or board.peers_checked:
        return
    board.set_phase(Phase.WAITING_FOR_PEERS)
    deadline = time.monotonic() + config.peer_timeout_seconds
    check = _start_preflight(config, board)
    try:
        if config.is_chief:
            _wait_as_chief(config, board, check, deadline)
        else:
            _wait_as_follower(config, board, check, deadline)
    finally:
        board.waiting_for([])
    board.mark_peers_checked()
    log.info(
        "peers resolve, preflight %s%s",
        "passed" if check else "skipped",
        "" if config.is_chief else f"; worker 0 at {config.peers[0]} is up",
    )


def _start_preflight(config: RuntimeConfig, board: ProgressBoard) -> GroupCheck | None:
    """Publishes this worker's fingerprint on GET /preflight (None: no port peers could find)."""
    if config.progress_port == 0 and not config.progress_ports:
        log.warning("%s=0: no preflight, the peers cannot find each other", MWJ_PROGRESS_PORT)
        return None
    from multiworker.runtime.fingerprint import collect  # noqa: PLC0415 (imports TensorFlow)

    mine = collect(config.fingerprint_override)
    check = GroupCheck(config, mine)
    board.set_software(mine.software)
    board.serve_preflight(check.document)
    return check


def _wait_as_chief(
    config: RuntimeConfig, board: ProgressBoard, check: GroupCheck | None, deadline: float
) -> None:
    """Collects the others' fingerprints, decides, and waits until all fetched the verdict."""
    others = [i for i in range(config.num_workers) if i != config.worker_index]
    endpoints = [_endpoint(config, i, "progress" if check else "name") for i in others]
    missing = _wait(endpoints, _prober(config, check), deadline, board, check, config)
    if check is None:
        if missing:
            raise _unreachable(config, missing)
        return
    difference = check.decide()
    if difference is None and missing:
        raise _unreachable(config, missing)
    if difference is not None:
        deadline = min(deadline, time.monotonic() + FAILED_LINGER_SECONDS)
    acks = [_endpoint(config, i, "progress") for i in others]
    unseen = _wait(acks, lambda e, _: check.seen_by(e.worker), deadline, board, None, config)
    if difference is not None:
        raise ConfigError([f"workers differ: {difference}"])
    if unseen:
        raise _unreachable(config, unseen)


def _wait_as_follower(
    config: RuntimeConfig, board: ProgressBoard, check: GroupCheck | None, deadline: float
) -> None:
    others = [i for i in range(1, config.num_workers) if i != config.worker_index]
    endpoints = [_endpoint(config, i, "name") for i in others]
    endpoints += [_endpoint(config, 0, "progress")] if check else []
    endpoints += [_endpoint(config, 0, "tensorflow")]
    missing = _wait(endpoints, _prober(config, check), deadline, board, check, config)
    if check and check.failure:
        raise ConfigError([f"workers differ: {check.failure}"])
    if missing:
        raise _unreachable(config, missing)


def _wait(
    endpoints: Sequence[Endpoint],
    probe: Probe,
    deadline: float,
    board: ProgressBoard,
    check: GroupCheck | None,
    config: RuntimeConfig,
) -> list[Endpoint]:
    """Probes the endpoints not ready yet, in parallel, every poll_seconds until all are
    ready, the deadline passes, or the preflight failed; returns those still not ready."""
    next_log = time.monotonic() + LOG_EVERY_SECONDS
    with ThreadPoolExecutor(min(_PARALLEL_PROBES, max(1, len(endpoints)))) as pool:
        while True:
            started = time.monotonic()
            pending = [e for e in endpoints if not e.ready]
            if not pending or started >= deadline or (check and check.failure):
                return pending
            timeouts = [max(0.1, min(deadline - started, PROBE_TIMEOUT_SECONDS))] * len(pending)
            for endpoint, (reach, detail) in zip(
                pending, pool.map(probe, pending, timeouts), strict=True
            ):
                if endpoint.record(reach, detail):
                    log.warning(
                        "%s; still waiting, up to %gs (%s)",
                        endpoint.describe(),
                        config.peer_timeout_seconds,
                        MWJ_PEER_TIMEOUT_SECONDS,
                    )
            board.waiting_for(_report(endpoints))
            if time.monotonic() >= next_log:
                for endpoint in endpoints:
                    if not endpoint.ready:
                        log.info("waiting for %s", endpoint.describe())
                next_log += LOG_EVERY_SECONDS
            time.sleep(max(0.0, poll_seconds(config.num_workers)
                           - (time.monotonic() - started)))


def poll_seconds(workers: int) -> float:
    return min(MAX_POLL_SECONDS, max(MIN_POLL_SECONDS, workers * POLL_SECONDS_PER_WORKER))


def _prober(config: RuntimeConfig, check: GroupCheck | None) -> Probe:
    def probe(endpoint: Endpoint, timeout: float) -> tuple[Reach, str]:
        try:
            if endpoint.kind == "name":
                return _resolves(endpoint.host)
            if endpoint.kind == "tensorflow":
                accepts(endpoint.host, endpoint.port, timeout)
                return Reach.READY, "accepts connections"
            assert check is not None
            if config.is_chief:
                report = get_json(endpoint.host, endpoint.port, PREFLIGHT_PATH, timeout)
                return check.take_report(endpoint.worker, report)
            verdict = get_json(endpoint.host, endpoint.port, check.query(), timeout)
            return check.take_verdict(verdict)
        except Unanswered as e:
            if e.status == 404 and check is not None:
                return (check.take_no_preflight(endpoint.worker) if config.is_chief
                        else check.take_chief_without_preflight())
            if e.status == 503:
                return Reach.NOT_READY, "up, but its script has not started the preflight yet"
            return e.reach, e.detail

    return probe


def _resolves(host: str) -> tuple[Reach, str]:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as e:
        return Reach.UNRESOLVED, f"name does not resolve ({e})"
    return Reach.READY, "resolves"


def _endpoint(config: RuntimeConfig, index: int, kind: str) -> Endpoint:
    host, tf_port = host_and_port(config.peers[index])
    port = config.progress_port_of(index) if kind == "progress" else tf_port
    return Endpoint(worker=index, kind=kind, host=host, port=port)


def _report(endpoints: Sequence[Endpoint]) -> list[dict[str, object]]:
    waiting = sorted(
        (e for e in endpoints if not e.ready), key=lambda e: (_SEVERITY.index(e.reach), e.worker)
    )
    return [e.report() for e in waiting[:MAX_REPORTED]]


def _unreachable(config: RuntimeConfig, missing: Sequence[Endpoint]) -> PeersUnreachable:
    return PeersUnreachable(
        f"peers not reachable after {config.peer_timeout_seconds:g}s "
        f"({MWJ_PEER_TIMEOUT_SECONDS}): " + "; ".join(e.describe() for e in missing)
    )
