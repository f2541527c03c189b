"""The worker's configuration, read from the environment the operator injects.

Parsing collects every problem (naming the variable and what is wrong) before failing, so a
broken pod spec is fixed in one round. Stdlib only: it runs before TensorFlow is imported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from multiworker.api.contract import (
    DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
    DEFAULT_PEER_TIMEOUT_SECONDS,
    DEFAULT_PROGRESS_PORT,
    MWJ_CHECKPOINT_DIR,
    MWJ_COLLECTIVE_TIMEOUT_SECONDS,
    MWJ_ELASTIC_BATCH,
    MWJ_JOB_NAME,
    MWJ_JOB_NAMESPACE,
    MWJ_JOB_UID,
    MWJ_MAX_WORKERS,
    MWJ_NODE_NAME,
    MWJ_NUM_WORKERS,
    MWJ_PEER_TIMEOUT_SECONDS,
    MWJ_POD_GENERATION_FILE,
    MWJ_PROGRESS_PORT,
    MWJ_PROGRESS_PORTS,
    MWJ_RESTART_COUNT,
    MWJ_RESUME_FROM_DIR,
    MWJ_SURVIVOR_SAVES,
    MWJ_TEST_FINGERPRINT_OVERRIDE,
    MWJ_WORKER_INDEX,
    TF_CONFIG,
)
from multiworker.runtime.errors import ConfigError

__all__ = [
    "MWJ_CHECKPOINT_DIR",
    "MWJ_COLLECTIVE_TIMEOUT_SECONDS",
    "MWJ_PEER_TIMEOUT_SECONDS",
    "MWJ_PROGRESS_PORT",
    "MWJ_PROGRESS_PORTS",
    "MWJ_RESUME_FROM_DIR",
    "RuntimeConfig",
    "host_and_port",
    "load_config",
]

STANDALONE_JOB_NAME = "local"


@dataclass(frozen=True)
class RuntimeConfig:
    """What one worker knows about its group. `peers` is empty when running standalone."""

    job_name: str
    worker_index: int
    peers: tuple[str, ...]
    # The group's generation: MWJ_RESTART_COUNT, or the in-place agent's word when higher. In
    # place the kubelet resolves MWJ_RESTART_COUNT from the pod's label as its own copy of the
    # pod has it, and a gate released by the operator's word can start the trainer before
    # that copy shows the label moved (seen: a new generation's trainer started as the old).
    restart_count: int
    checkpoint_dir: str | None
    progress_port: int
    peer_timeout_seconds: float
    collective_timeout_seconds: float
    progress_ports: tuple[int, ...] = ()
    """Each worker's progress port by index (MWJ_PROGRESS_PORTS); empty: all use ours."""
    fingerprint_override: str | None = None
    """MWJ_TEST_FINGERPRINT_OVERRIDE, for tests: JSON fields the preflight reports instead."""
    job_namespace: str = ""
    job_uid: str = ""
    resume_from_dir: str | None = None
    """Another run's checkpoint directory this job may restore from on purpose."""
    node_name: str | None = None
    """The node this pod runs on (MWJ_NODE_NAME); None when unknown (outside Kubernetes)."""
    pod_generation_file: str | None = None
    """MWJ_POD_GENERATION_FILE: the pod's generation as it is now (in-place restarts)."""
    survivor_saves: bool = True
    """MWJ_SURVIVOR_SAVES (not "0"): survivors of a peer's death save their replicas."""
    max_workers: int = 0
    """MWJ_MAX_WORKERS: spec.workers of a job whose group spec.elastic may make smaller; 0:
    the group is always whole."""
    elastic_batch: str = "KeepGlobal"
    """MWJ_ELASTIC_BATCH: what a smaller group keeps (runtime/elastic.py)."""

    @property
    def num_workers(self) -> int:
        return max(1, len(self.peers))

    @property
    def is_chief(self) -> bool:
        """Worker 0 writes the real checkpoints and model (TF's MWMS convention)."""
        return self.worker_index == 0

    @property
    def is_standalone(self) -> bool:
        """No TF_CONFIG: a local single-process run, e.g. a smoke test on a laptop."""
        return not self.peers

    def progress_port_of(self, index: int) -> int:
        """Where worker `index` serves /progress and /preflight (on its host in `peers`)."""
        return self.progress_ports[index] if self.progress_ports else self.progress_port


def load_config(environ: Mapping[str, str]) -> RuntimeConfig:
    """Parses and cross-checks TF_CONFIG and MWJ_*; raises ConfigError listing every problem."""
    problems: list[str] = []
    raw_tf_config = environ.get(TF_CONFIG)
    num_workers = _integer(environ, MWJ_NUM_WORKERS, None, 1, None, problems)
    worker_index = _integer(environ, MWJ_WORKER_INDEX, None, 0, None, problems)
    if raw_tf_config is None:
        peers: tuple[str, ...] = ()
        task_index = 0
        if num_workers not in (None, 1):
            problems.append(f"{TF_CONFIG}: missing, but {MWJ_NUM_WORKERS}={num_workers}")
    else:
        peers, task_index = _parse_tf_config(raw_tf_config, problems)
        _check_agrees(peers, task_index, num_workers, worker_index, problems)
    config = RuntimeConfig(
        job_name=environ.get(MWJ_JOB_NAME) or STANDALONE_JOB_NAME,
        job_namespace=environ.get(MWJ_JOB_NAMESPACE, ""),
        job_uid=environ.get(MWJ_JOB_UID, ""),
        resume_from_dir=environ.get(MWJ_RESUME_FROM_DIR) or None,
        pod_generation_file=environ.get(MWJ_POD_GENERATION_FILE) or None,
        node_name=environ.get(MWJ_NODE_NAME) or None,
        survivor_saves=environ.get(MWJ_SURVIVOR_SAVES, "1") != "0",
        max_workers=_integer(environ, MWJ_MAX_WORKERS, 0, 0, None, problems) or 0,
        elastic_batch=environ.get(MWJ_ELASTIC_BATCH) or "KeepGlobal",
        worker_index=task_index,
        peers=peers,
        restart_count=max(_integer(environ, MWJ_RESTART_COUNT, 0, 0, None, problems) or 0,
                          _pod_generation(environ.get(MWJ_POD_GENERATION_FILE)) or 0),
        checkpoint_dir=environ.get(MWJ_CHECKPOINT_DIR) or None,
        progress_port=_port(environ, problems),
        peer_timeout_seconds=_seconds(
            environ, MWJ_PEER_TIMEOUT_SECONDS, float(DEFAULT_PEER_TIMEOUT_SECONDS), problems
        ),
        collective_timeout_seconds=_seconds(
            environ,
            MWJ_COLLECTIVE_TIMEOUT_SECONDS,
            float(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS),
            problems,
        ),
    )
    config = _with_progress_ports(config, environ, problems)
    if environ.get(MWJ_TEST_FINGERPRINT_OVERRIDE):
        config = replace(config, fingerprint_override=environ[MWJ_TEST_FINGERPRINT_OVERRIDE])
    if problems:
        raise ConfigError(problems)
    return config


def host_and_port(address: str) -> tuple[str, int]:
    """Splits a validated 'host:port' ('[v6]:port' too) into what sockets take."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _with_progress_ports(
    config: RuntimeConfig, environ: Mapping[str, str], problems: list[str]
) -> RuntimeConfig:
    """MWJ_PROGRESS_PORTS: one port per worker; ours defaults to its entry for our index."""
    raw = environ.get(MWJ_PROGRESS_PORTS)
    if raw is None:
        return config
    if config.is_standalone:
        if TF_CONFIG not in environ:  # else TF_CONFIG's own problem is reported
            problems.append(f"{MWJ_PROGRESS_PORTS}: set, but {TF_CONFIG} is missing")
        return config
    try:
        ports = tuple(int(part) for part in raw.split(","))
    except ValueError:
        problems.append(f"{MWJ_PROGRESS_PORTS}: {raw!r} is not a comma-separated list of ports")
        return config
    if len(ports) != len(config.peers) or not all(0 < p < 65536 for p in ports):
        problems.append(
            f"{MWJ_PROGRESS_PORTS}: {raw!r} must list {len(config.peers)} ports in 1..65535, "
            f"one per worker in {TF_CONFIG}.cluster.worker"
        )
        return config
    own = ports[config.worker_index] if config.worker_index < len(ports) else None
    if environ.get(MWJ_PROGRESS_PORT) is not None and own != config.progress_port:
        problems.append(
            f"{MWJ_PROGRESS_PORTS}: lists {own} for this worker, but "
            f"{MWJ_PROGRESS_PORT}={config.progress_port}"
        )
    return replace(config, progress_ports=ports, progress_port=own or config.progress_port)


def _parse_tf_config(raw: str, problems: list[str]) -> tuple[tuple[str, ...], int]:
    """Returns (worker addresses, task index); appends problems instead of raising."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as e:
        problems.append(f"{TF_CONFIG}: not valid JSON ({e})")
        return (), 0
    if not isinstance(document, dict):
        problems.append(f"{TF_CONFIG}: must be a JSON object, got {type(document).__name__}")
        return (), 0
    peers = _parse_cluster(document.get("cluster"), problems)
    index = _parse_task(document.get("task"), len(peers), problems)
    return peers, index


def _parse_cluster(cluster: Any, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(cluster, dict):
        problems.append(f"{TF_CONFIG}.cluster: missing or not an object")
        return ()
    others = sorted(set(cluster) - {"worker"})
    if others:
        problems.append(
            f"{TF_CONFIG}.cluster: only 'worker' tasks are supported, got {', '.join(others)}"
        )
    workers = cluster.get("worker")
    if not isinstance(workers, list) or not workers:
        problems.append(f"{TF_CONFIG}.cluster.worker: missing or not a non-empty list")
        return ()
    for i, address in enumerate(workers):
        problem = _address_problem(address)
        if problem:
            problems.append(f"{TF_CONFIG}.cluster.worker[{i}]: {problem}")
    duplicates = sorted({a for a in workers if isinstance(a, str) and workers.count(a) > 1})
    if duplicates:
        problems.append(f"{TF_CONFIG}.cluster.worker: duplicate addresses {', '.join(duplicates)}")
    return tuple(str(a) for a in workers)


def _address_problem(address: Any) -> str | None:
    if not isinstance(address, str):
        return f"must be a 'host:port' string, got {address!r}"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address!r} is not 'host:port' with a port in 1..65535"
    return None


def _parse_task(task: Any, num_workers: int, problems: list[str]) -> int:
    if not isinstance(task, dict):
        problems.append(f"{TF_CONFIG}.task: missing or not an object")
        return 0
    if task.get("type") != "worker":
        problems.append(f"{TF_CONFIG}.task.type: must be 'worker', got {task.get('type')!r}")
    index = task.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        problems.append(f"{TF_CONFIG}.task.index: must be an integer, got {index!r}")
        return 0
    if num_workers and not 0 <= index < num_workers:
        problems.append(
            f"{TF_CONFIG}.task.index: {index} is out of range for {num_workers} workers "
            f"(0..{num_workers - 1})"
        )
    return index


def _check_agrees(
    peers: tuple[str, ...],
    task_index: int,
    num_workers: int | None,
    worker_index: int | None,
    problems: list[str],
) -> None:
    """MWJ_* duplicate TF_CONFIG for scripts; a disagreement means a rendering bug."""
    if peers and num_workers is not None and num_workers != len(peers):
        problems.append(
            f"{MWJ_NUM_WORKERS}: {num_workers} does not match the {len(peers)} workers "
            f"in {TF_CONFIG}.cluster.worker"
        )
    if worker_index is not None and worker_index != task_index:
        problems.append(
            f"{MWJ_WORKER_INDEX}: {worker_index} does not match {TF_CONFIG}.task.index {task_index}"
        )


def _integer(
    environ: Mapping[str, str],
    name: str,
    default: int | None,
    minimum: int,
    maximum: int | None,
    problems: list[str],
) -> int | None:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{name}: {raw!r} is not an integer")
        return default
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        problems.append(f"{name}: {value} is out of range ({bound})")
        return default
    return value


def _port(environ: Mapping[str, str], problems: list[str]) -> int:
    """0 is allowed: the OS picks a free port (handy for standalone runs)."""
    port = _integer(environ, MWJ_PROGRESS_PORT, DEFAULT_PROGRESS_PORT, 0, 65535, problems)
    return DEFAULT_PROGRESS_PORT if port is None else port


def _seconds(environ: Mapping[str, str], name: str, default: float, problems: list[str]) -> float:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        problems.append(f"{name}: {raw!r} is not a number of seconds")
        return default
    if not math.isfinite(value) or value <= 0:
        problems.append(f"{name}: {raw!r} must be a positive, finite number of seconds")
        return default
    return value


def _pod_generation(path: str | None) -> int | None:
    """The pod's generation as its in-place agent knows it (MWJ_POD_GENERATION_FILE); None
    when nothing says."""
    if path is None:
        return None
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def superseded(config: RuntimeConfig) -> bool:
    """Whether this pod has moved to a newer generation than this trainer's (an in-place
    restart of its group is stopping it). False when nothing says so."""
    generation = _pod_generation(config.pod_generation_file)
    return generation is not None and generation > config.restart_count
