"""`run`: the one place that turns a training script's outcome into a contract exit code."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import NoReturn

from multiworker.api.contract import FINAL_REPORT_PREFIX, PEER_FAILURE_EXIT_CODES
from multiworker.runtime.config import RuntimeConfig, load_config, superseded
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.errors import ConfigError, ExitCode, RuntimeFailure
from multiworker.runtime.exits import (
    PEERS_LAST_READ_SECONDS,
    exit_now,
    write_termination_message,
)
from multiworker.runtime.preemption import StopSignal
from multiworker.runtime.progress import Phase, ProgressBoard, serve_progress
from multiworker.runtime.watchdog import CollectiveWatchdog

log = logging.getLogger("multiworker.runtime")


def run(
    main: Callable[[WorkerContext], None], environ: Mapping[str, str] | None = None
) -> NoReturn:
    """Loads the config (exit 2), serves /progress, calls `main`, and exits with its outcome:
    0 done, 2/3/4/5/143 for the runtime's failures; any other exception keeps its traceback,
    exit 1.
    """
    try:
        config = load_config(os.environ if environ is None else environ)
    except ConfigError as e:
        _configure_logging("worker ?")
        for problem in e.problems:
            log.error("bad configuration: %s", problem)
        write_termination_message(f"{e} (exit {ExitCode.BAD_CONFIG:d})")
        exit_now(ExitCode.BAD_CONFIG)
    _configure_logging(_worker_label(config))
    context = WorkerContext(
        config=config,
        progress=ProgressBoard(config.worker_index, config.restart_count),
        stop=StopSignal(superseded=lambda: superseded(config)),
        watchdog=CollectiveWatchdog(config.collective_timeout_seconds),
    )
    serve_progress(context.progress, config.progress_port)
    log.info(
        "job %s, worker %d of %d, generation %d, checkpoints %s",
        config.job_name,
        config.worker_index,
        config.num_workers,
        config.restart_count,
        config.checkpoint_dir or "off",
    )
    try:
        main(context)
    except RuntimeFailure as e:
        context.progress.set_phase(Phase.FAILED)
        clean = e.exit_code in _STOPS
        peers_gone = e.exit_code in PEER_FAILURE_EXIT_CODES
        log.log(logging.WARNING if clean else logging.ERROR, "%s (exit %d)", e, e.exit_code)
        write_termination_message(f"{e} (exit {e.exit_code:d})")
        exit_now(e.exit_code, 0.0 if peers_gone else PEERS_LAST_READ_SECONDS)
    except BaseException:
        context.progress.set_phase(Phase.FAILED)
        raise
    context.progress.set_phase(Phase.DONE)
    write_termination_message(FINAL_REPORT_PREFIX + json.dumps(
        {k: v for k, v in context.progress.snapshot().items() if k not in _NOT_FINAL},
        separators=(",", ":")))
    log.info("done")
    raise SystemExit(ExitCode.DONE)


# Stops the group was asked for (SIGTERM, a newer generation), not failures: logged as warnings.
_STOPS = frozenset({ExitCode.PREEMPTED, ExitCode.SUPERSEDED})
# What the final report leaves out: the start-up's business, not the end's.
_NOT_FINAL = frozenset({"peers", "software"})


def _worker_label(config: RuntimeConfig) -> str:
    return f"worker {config.worker_index}/{config.num_workers}"


def _configure_logging(label: str) -> None:
    """One line per event, prefixed with the worker so interleaved group logs stay readable.
    TensorFlow's logger keeps its own handler; propagating too would print its lines twice."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s [{label}] %(message)s",
        force=True,
    )
    logging.getLogger("tensorflow").propagate = False
