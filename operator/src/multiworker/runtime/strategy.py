# mypy: disable-error-code="import-untyped"
# mypy: allow-subclassing-any
"""Building the MultiWorkerMirroredStrategy with failure detection switched on.

How a dead or stopped peer is detected (TF 2.21, read from collective_all_reduce_strategy.py):

- MWMS enables TF's coordination service (leader: worker 0) and then *disables* its Python
  health-check thread (`CollectiveAllReduceExtended._enable_check_health`,
  `_check_health_interval`, `_check_health_timeout`, `_check_health_initial_timeout`), because
  the service's heartbeats replace it. Setting those attributes therefore changes nothing; we
  configure the coordination service instead, before MWMS would with its defaults:
  `heartbeat_timeout_in_ms`: a worker whose heartbeats stop for that long (dead, SIGSTOPped,
  partitioned) is reported to all others and their collectives abort with UnavailableError.
  `cluster_register_timeout_in_ms` with `cluster_register_with_barrier` (not exposed by
  `configure_coordination_service`, set on its proto): the constructor fails after that long
  if some worker never registers. Without the barrier, worker 0 waits forever (measured).
  `shutdown_barrier_timeout_in_ms`: how long a finished worker waits for the others at exit.
- A collective that waits past MWJ_COLLECTIVE_TIMEOUT_SECONDS is aborted by the runtime's
  watchdog (watchdog.py), not by `CommunicationOptions.timeout_seconds`, whose thread per
  collective outlives the collective by the whole timeout (thousands of threads a minute).
  This catches what heartbeats cannot: a stopped *leader* (worker 0 runs the service, so
  nobody reports it).

Both take MWJ_COLLECTIVE_TIMEOUT_SECONDS, so a gone peer aborts training within about that time.
Measured with 3 CPU workers on loopback and 15 s: SIGKILL of worker 1 -> its ring neighbour
fails at once (connection reset), worker 0 within 9-15 s; SIGSTOP of worker 1 -> 10-13 s.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.eager import context as tf_context

from multiworker.runtime.aborts import named_peers
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import PeersUnreachable
from multiworker.runtime.peers import wait_for_peers
from multiworker.runtime.progress import Phase

log = logging.getLogger(__name__)

JOB = "worker"
LEADER = f"/job:{JOB}/replica:0/task:0"


class KerasCompatibleStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """MWMS whose `reduce` accepts what Keras 3's `fit` passes it (keras-team/keras#20585).

    Keras 3 reduces a whole (x, y) batch structure at once and reduces scalar metrics with
    `axis=0`; MWMS accepts neither. Reducing leaf by leaf, with `axis=None` for scalars, is
    what Keras means in both cases.
    """

    def reduce(self, reduce_op: Any, value: Any, axis: int | None) -> Any:
        return tf.nest.map_structure(lambda v: self._reduce_leaf(reduce_op, v, axis), value)

    def _reduce_leaf(self, reduce_op: Any, value: Any, axis: int | None) -> Any:
        rank = self.experimental_local_results(value)[0].shape.rank
        return super().reduce(reduce_op, value, None if rank == 0 else axis)


def make_strategy(context: WorkerContext) -> tf.distribute.MultiWorkerMirroredStrategy:
    """Builds MWMS for this worker (standalone: a local one) and takes over SIGTERM.

    Blocks until every worker has joined, at most MWJ_PEER_TIMEOUT_SECONDS, else raises
    PeersUnreachable (exit 3). Runs `wait_for_peers` (names, the preflight, worker 0's port)
    first unless the script did: it waits with progress logs, which are impossible in the
    constructor (it holds the GIL while it blocks).
    """
    config = context.config
    wait_for_peers(context)
    gpus = len(tf.config.list_physical_devices("GPU"))
    options = communication_options(gpus)
    if not config.is_standalone:
        context.progress.set_phase(Phase.WAITING_FOR_PEERS)
        _configure_coordination_service(config)
    try:
        strategy = KerasCompatibleStrategy(
            cluster_resolver=_resolver(config, gpus), communication_options=options
        )
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        log.warning("joining the group failed in TensorFlow:\n%s", e.message)
        # Worker 0's barrier error lists the absent workers after this phrase.
        absent = e.message.split("timed out task names:", 1)[-1]
        missing = named_peers(absent, config) or ["not named by TensorFlow"]
        raise PeersUnreachable(
            f"group did not form within {config.peer_timeout_seconds:g}s "
            f"(MWJ_PEER_TIMEOUT_SECONDS); missing: {', '.join(missing)}"
        ) from e
    context.stop.install()
    log.info(
        "strategy ready: %d replicas, %s all-reduce, collective bound %gs (watchdog)",
        strategy.num_replicas_in_sync,
        options.implementation.name,
        config.collective_timeout_seconds,
    )
    return strategy


def communication_options(gpus: int) -> tf.distribute.experimental.CommunicationOptions:
    """NCCL when GPUs are visible (it is the fast GPU path), RING over gRPC otherwise; no
    `timeout_seconds` (see the module docstring: the watchdog bounds collectives)."""
    implementation = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.NCCL if gpus else implementation.RING
    )


def _resolver(config: RuntimeConfig, gpus: int) -> tf.distribute.cluster_resolver.ClusterResolver:
    """From the validated config rather than TF re-reading TF_CONFIG; the GPU count must be
    given explicitly, otherwise a SimpleClusterResolver makes MWMS use the CPU only."""
    cluster = {JOB: list(config.peers)} if config.peers else {}
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type=JOB if config.peers else None,
        task_id=config.worker_index if config.peers else None,
        num_accelerators={"GPU": gpus},
        rpc_layer="grpc",
    )


def _configure_coordination_service(config: RuntimeConfig) -> None:
    collective_ms = int(config.collective_timeout_seconds * 1000)
    peer_ms = int(config.peer_timeout_seconds * 1000)
    tf_context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=LEADER,
        enable_health_check=True,
        cluster_register_timeout_in_ms=peer_ms,
        heartbeat_timeout_in_ms=collective_ms,
        shutdown_barrier_timeout_in_ms=peer_ms,
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=JOB, num_tasks=config.num_workers)
        ],
    )
    tf_context.context().coordination_service.cluster_register_with_barrier = True
