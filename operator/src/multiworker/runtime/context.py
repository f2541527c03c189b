"""What every runtime step needs about this worker, handed to the user's `main` by `run`."""

from __future__ import annotations

from dataclasses import dataclass

from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.preemption import StopSignal
from multiworker.runtime.progress import ProgressBoard
from multiworker.runtime.watchdog import CollectiveWatchdog


@dataclass(frozen=True)
class WorkerContext:
    """The parsed configuration, the progress board the operator polls, the SIGTERM flag, and
    the watchdog that bounds collectives (watchdog.py)."""

    config: RuntimeConfig
    progress: ProgressBoard
    stop: StopSignal
    watchdog: CollectiveWatchdog
