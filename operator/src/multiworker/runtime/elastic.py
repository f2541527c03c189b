"""What a training script does when spec.elastic lets its group be smaller than spec.workers
(between two generations, never within one). Stdlib only.

A script written for the full size passes its full-size global batch and learning rate
through `sized`, and gets what this generation trains with:

- KeepGlobal (the default): the same global batch, split over fewer workers; each step's maths
  is the same (exactly, where the batch divides evenly), so is the learning rate; the input
  pipeline resumes at the restored step and reads on from the sample where the last
  generation stopped (inputs.distribute; tests/runtime/test_resize_inputs.py).
- ScaleLearningRate: each worker's batch stays the same, so the global batch and, by the linear
  scaling rule, the learning rate follow the size (× workers / spec.workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from multiworker.runtime.config import RuntimeConfig

KEEP_GLOBAL, SCALE_LEARNING_RATE = "KeepGlobal", "ScaleLearningRate"


@dataclass(frozen=True)
class Sized:
    global_batch: int
    learning_rate: float
    workers: int
    max_workers: int


def sized(config: RuntimeConfig, global_batch: int, learning_rate: float) -> Sized:
    """This generation's global batch and learning rate, from the full-size ones."""
    workers = config.num_workers
    full = max(config.max_workers, workers)
    if config.elastic_batch != SCALE_LEARNING_RATE or workers == full:
        return Sized(global_batch, learning_rate, workers, full)
    per_worker = max(1, global_batch // full)
    return Sized(per_worker * workers, learning_rate * workers / full, workers, full)
