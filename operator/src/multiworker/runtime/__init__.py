"""Helpers for training scripts in MultiWorkerJob worker pods (stdlib + TensorFlow only).

A training script::

    from multiworker import runtime

    def main(ctx: runtime.WorkerContext) -> None:
        runtime.wait_for_peers(ctx)             # names, same TF/GPUs (else 2), worker 0 up (else 3)
        strategy = runtime.make_strategy(ctx)   # MWMS with failure detection; 3 on timeout
        with strategy.scope():
            model = build_and_compile()
        runtime.fit(ctx, model, dataset, epochs=5, steps_per_epoch=100)  # resume, 4/5/143
        runtime.save_model(ctx, model, "/out/model.keras")

    runtime.run(main)                           # config (exit 2), /progress, exit codes

The TensorFlow-backed names load on first use, so that configuration errors are reported
(exit 2) without paying for TensorFlow's import, and `config` is usable without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from multiworker.runtime.config import RuntimeConfig, load_config
from multiworker.runtime.context import WorkerContext
from multiworker.runtime.entrypoint import run
from multiworker.runtime.errors import (
    CollectiveAborted,
    ConfigError,
    ExitCode,
    PeersUnreachable,
    Preempted,
    RuntimeFailure,
    Superseded,
)
from multiworker.runtime.peers import wait_for_peers

if TYPE_CHECKING:
    from multiworker.runtime.checkpoint import save_model
    from multiworker.runtime.strategy import make_strategy
    from multiworker.runtime.training import fit

_TENSORFLOW_BACKED = {
    "make_strategy": "multiworker.runtime.strategy",
    "fit": "multiworker.runtime.training",
    "save_model": "multiworker.runtime.checkpoint",
}

__all__ = [
    "CollectiveAborted",
    "ConfigError",
    "ExitCode",
    "PeersUnreachable",
    "Preempted",
    "RuntimeConfig",
    "RuntimeFailure",
    "Superseded",
    "WorkerContext",
    "fit",
    "load_config",
    "make_strategy",
    "run",
    "save_model",
    "wait_for_peers",
]


def __getattr__(name: str) -> Any:
    if name in _TENSORFLOW_BACKED:
        return getattr(importlib.import_module(_TENSORFLOW_BACKED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
