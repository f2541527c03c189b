# mypy: disable-error-code="import-untyped"
"""What the workers agree on before they restore or save, each time in one small all-reduce
that all of them run at the same point: that no newer generation claimed MWJ_CHECKPOINT_DIR
(fence.py), that every worker sees the directory (shared_volume.py), and that all found the
same checkpoint step.

Agreeing, rather than each worker deciding alone, stops the whole group at once with one exit
code: a worker that stopped alone would leave the others waiting in the next collective until
it aborts (exit 4, a restart spent) — and the others' reason would be lost.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import tensorflow as tf

from multiworker.runtime import fence
from multiworker.runtime.collective import sum_over_workers
from multiworker.runtime.config import MWJ_CHECKPOINT_DIR, RuntimeConfig
from multiworker.runtime.errors import ConfigError, Superseded
from multiworker.runtime.shared_volume import (
    MARKER_WAIT_SECONDS,
    marker_nodes,
    remove_older_markers,
    unshared_message,
    wait_for_markers,
    write_marker,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MarkerView:
    """What one worker saw of the group's markers: whose it could not see, after how long."""

    unseen: list[int]
    waited: float


def enter_directory(
    strategy: tf.distribute.Strategy, config: RuntimeConfig, directory: str
) -> MarkerView:
    """The start of a run with checkpoints in `directory`, before anything reads it: the chief
    claims the fence, each worker leaves its marker, the group agrees that none is superseded
    — after that all-reduce every marker is written, so a late one means an unshared
    directory, not a slow peer — then each worker looks for the others' markers."""
    mine = fence.own_fence(config)
    newer = (fence.claim(directory, mine) if config.is_chief
             else fence.check(directory, mine, reclaim=False))
    if newer is None:
        write_marker(directory, mine.generation, config.worker_index, config.node_name, mine.pod)
    stop_if_superseded(strategy, config, newer, step=None)
    wait = marker_wait_seconds(config)
    started = time.monotonic()
    unseen = wait_for_markers(directory, mine.generation, config.num_workers, wait)
    log.log(
        logging.WARNING if unseen else logging.INFO,
        "%d of %d workers' markers visible in %s after %.1fs",
        config.num_workers - len(unseen), config.num_workers, directory,
        time.monotonic() - started,
    )
    return MarkerView(unseen, wait)


def marker_wait_seconds(config: RuntimeConfig) -> float:
    """Workers that see every marker wait in the next all-reduce for those still looking: keep
    the look well inside the collective timeout, or that wait aborts (exit 4)."""
    return min(MARKER_WAIT_SECONDS, config.collective_timeout_seconds / 2)


def stop_if_superseded(
    strategy: tf.distribute.Strategy,
    config: RuntimeConfig,
    newer: fence.Fence | None,
    step: int | None,
) -> None:
    """Raises Superseded on every worker when any of them found a newer generation's fence
    (`step` None: before training)."""
    if not sum_over_workers(strategy, [int(newer is not None)])[0]:
        return
    directory = _directory(config)
    if newer is None:  # another worker saw it first; by now this one may see it too
        newer = fence.check(directory, fence.own_fence(config), reclaim=False)
    raise Superseded(
        fence.superseded_message(directory, newer, config.restart_count, step)
    )


def check_same_directory_and_step(
    strategy: tf.distribute.Strategy, config: RuntimeConfig, step: int, view: MarkerView | None
) -> None:
    """The first all-reduce that may differ between workers: how many markers each worker
    misses, and the step each found (equal sums of x and x**2 over workers hold only if every
    worker has the same x). Raises ConfigError (exit 2) on every worker for an unshared
    directory, or for different checkpoints: restoring them would train diverging replicas."""
    n = config.num_workers
    missed = [0] * n
    if view is not None:
        missed[config.worker_index] = len(view.unseen)
    sums = sum_over_workers(strategy, [step, step**2, *missed])
    blind = [worker for worker, count in enumerate(sums[2:]) if count]
    if blind:
        raise ConfigError([_unshared(config, view, blind)])
    if sums[:2] != [n * step, n * step**2]:
        raise ConfigError(
            [
                f"{MWJ_CHECKPOINT_DIR}: workers found different checkpoints (worker "
                f"{config.worker_index} found step {step} in {config.checkpoint_dir}); the "
                "directory must be storage shared by all workers (ReadWriteMany; on kind, the "
                "folder every node mounts), not node-local"
            ]
        )
    if view is not None and config.is_chief:
        remove_older_markers(_directory(config), config.restart_count)


def _unshared(config: RuntimeConfig, view: MarkerView | None, blind: list[int]) -> str:
    directory = _directory(config)
    unseen = view.unseen if view else []
    # A worker that sees every marker reads the blind workers' nodes from theirs.
    nodes = {} if unseen else marker_nodes(directory, config.restart_count, blind)
    return unshared_message(
        directory, config.worker_index, config.node_name, unseen, blind, nodes,
        view.waited if view else 0.0,
    )


def _directory(config: RuntimeConfig) -> str:
    return config.checkpoint_dir or "(unset on this worker)"
