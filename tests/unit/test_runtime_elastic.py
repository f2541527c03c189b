"""runtime/elastic.py: what a smaller group trains with."""

from __future__ import annotations

import json

import pytest
from multiworker.runtime.config import RuntimeConfig, load_config
from multiworker.runtime.elastic import Sized, sized


def config(workers: int, max_workers: int | None, batch: str | None = None) -> RuntimeConfig:
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"w{i}:2222" for i in range(workers)]},
                                    "task": {"type": "worker", "index": 0}}),
           "MWJ_NUM_WORKERS": str(workers)}
    if max_workers is not None:
        env["MWJ_MAX_WORKERS"] = str(max_workers)
    if batch is not None:
        env["MWJ_ELASTIC_BATCH"] = batch
    return load_config(env)


@pytest.mark.parametrize(("workers", "max_workers", "batch", "expected"), [
    (4, None, None, Sized(64, 0.1, 4, 4)),  # not elastic
    (4, 4, "ScaleLearningRate", Sized(64, 0.1, 4, 4)),  # whole
    (2, 4, "KeepGlobal", Sized(64, 0.1, 2, 4)),  # the same step, over fewer workers
    (2, 4, None, Sized(64, 0.1, 2, 4)),  # KeepGlobal is the default
    (2, 4, "ScaleLearningRate", Sized(32, 0.05, 2, 4)),  # 16 per worker; lr × 2/4
    (3, 4, "ScaleLearningRate", Sized(48, 0.1 * 3 / 4, 3, 4)),
])
def test_a_generation_trains_with(workers: int, max_workers: int | None, batch: str | None,
                                  expected: Sized) -> None:
    assert sized(config(workers, max_workers, batch), 64, 0.1) == expected
