# mypy: disable-error-code="import-untyped"
"""Survivor saves: when a peer dies, every surviving worker writes its own replica.

In data-parallel MWMS every worker holds the whole model and optimizer, so the state at the
last step is in the survivors' memory when a collective fails because a peer died; ordinary
ops still run then, only collectives fail (measured with TF 2.21: a `tf.train.Checkpoint.write`
of model and optimizer takes 0.06-0.22 s and needs none). Each survivor writes
`<MWJ_CHECKPOINT_DIR>/survivors/g<generation>-w<worker>-s<step>/`, the checkpoint first and
`state.json` last (atomically): a save without it is torn and never restored. The next group
restores the newest of these and the periodic checkpoint (checkpoint.CheckpointStore.find).

The step its weights reflect is not the optimizer's counter: Keras 3 may count a step whose
gradient all-reduce then failed (weights at N, iterations at N+1), and a collective after the
update (the logs' reduction) may fail once the weights moved (N+1). So after every step the
witness keeps the step and a fingerprint of the weights; at the failure the weights either
still match it (step N) or do not (N+1: the failing step's update was applied — its gradients
arrive in one all-reduce, so never in part).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from multiworker.api.contract import SURVIVOR_SAVED
from multiworker.runtime import fence
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.files import read_json, write_json
from multiworker.runtime.samples import SampleCount, checkpointed

log = logging.getLogger(__name__)

SURVIVORS_DIR = "survivors"
STATE_FILE = "state.json"
# Training counts as stuck (in a collective whose peer is gone) once no step completed for
# this long, or for three of its usual steps if they are longer.
STUCK_SECONDS = 2.0
_NAME = re.compile(r"^g(\d+)-w(\d+)-s(\d+)$")


@dataclass(frozen=True)
class SurvivorSave:
    """One survivor's complete save: its checkpoint prefix, the step its weights reflect, and
    the generation and worker that wrote it."""

    path: str
    step: int
    generation: int
    worker: int
    seconds: float = 0.0  # how long the write took

    def describe(self) -> str:
        return f"survivor worker-{self.worker}, generation {self.generation}"


def newest(directory: str, job_uid: str) -> SurvivorSave | None:
    """The complete survivor save of job `job_uid` of the highest step in `directory` (a later
    generation first among equals); torn ones (no state.json, or one that disagrees) and
    another job's are skipped."""
    found = []
    root = os.path.join(directory, SURVIVORS_DIR)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for name in names:
        save = _read(os.path.join(root, name), job_uid)
        if save is not None:
            found.append(save)
    return max(found, key=lambda s: (s.step, s.generation, -s.worker), default=None)


def prune(directory: str, saved_step: int) -> None:
    """Removes survivor saves a periodic checkpoint at `saved_step` makes redundant (the chief,
    after each save): those of no higher step."""
    root = os.path.join(directory, SURVIVORS_DIR)
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        match = _NAME.match(name)
        if match and int(match[3]) <= saved_step:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _read(path: str, job_uid: str) -> SurvivorSave | None:
    match = _NAME.match(os.path.basename(path))
    if match is None:
        return None
    try:
        state = read_json(os.path.join(path, STATE_FILE))
        generation, worker, step = int(state["generation"]), int(state["worker"]), \
            int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (generation, worker, step) != tuple(int(g) for g in match.groups()) or \
            state.get("jobUid") != job_uid:
        return None
    return SurvivorSave(os.path.join(path, "ckpt"), step, generation, worker,
                        float(state.get("seconds", 0.0)))


class Witness:
    """The last completed step and a fingerprint of the weights it left (kept after each
    step; computed without a collective: a MirroredVariable reads its local copy)."""

    def __init__(self, model: keras.Model) -> None:
        self._model = model
        self._fingerprint: Any = None  # built at the first step: a model builds lazily
        self.step: int | None = None
        self._seen: tf.Tensor | None = None
        self._at = time.monotonic()  # when the last step completed
        self._usual = 0.0  # a step's usual duration (moving average)
        self.lock = threading.Lock()  # one save at a time (the main thread or a signal's)
        self.saved: SurvivorSave | None = None

    def step_done(self, step: int) -> None:
        if self._fingerprint is None:
            variables = list(self._model.trainable_variables)

            def fingerprint() -> tf.Tensor:
                return tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64)) for v in variables])

            self._fingerprint = tf.function(fingerprint) if variables else False
        first = self.step is None
        self.step = step
        self._seen = self._fingerprint() if self._fingerprint else None
        now = time.monotonic()
        # The first step's time holds the start-up (markers, restore, tracing): counted, it
        # made a hang early in a generation count as stuck only after survivorSaveSeconds.
        if not first:
            took = now - self._at
            self._usual = 0.9 * self._usual + 0.1 * took if self._usual else took
        self._at = now

    def stepped_since(self, moment: float) -> bool:
        """Whether a step completed after `moment` (monotonic)."""
        return self.step is not None and self._at > moment

    def stuck(self) -> bool:
        """No step completed for much longer than steps take (after the first one)."""
        waited = time.monotonic() - self._at
        return self.step is not None and waited > max(STUCK_SECONDS, 3 * self._usual)

    def reflected(self) -> tuple[int | None, Any]:
        """The step the weights reflect now, after a failed step (None: no step completed in
        this generation, so nothing newer than what it restored), and the weights' fingerprint
        it was judged by (None: none)."""
        if self.step is None:
            return None, None
        if not self._fingerprint or self._seen is None:
            return self.step, None
        now = self._fingerprint().numpy()
        return (self.step + 1 if bool(now != self._seen.numpy()) else self.step), now

    def unchanged_since(self, fingerprint: Any) -> bool:
        """Whether the weights still have `fingerprint` (from reflected()); None: cannot tell,
        so yes."""
        return fingerprint is None or bool(self._fingerprint().numpy() == fingerprint)


def save(model: keras.Model, config: RuntimeConfig, witness: Witness,
         samples: SampleCount | None = None) -> SurvivorSave | None:
    """Writes this survivor's replica, and the sample count of a run that keeps one (fenced:
    never once a newer generation claimed the directory); None when there is nothing newer to
    keep or it may not write."""
    directory = config.checkpoint_dir
    if directory is None or not config.survivor_saves:
        return None
    with witness.lock:
        if witness.saved is None:
            witness.saved = _write(model, config, witness, directory, samples)
        return witness.saved


def _write(model: keras.Model, config: RuntimeConfig, witness: Witness, directory: str,
           samples: SampleCount | None) -> SurvivorSave | None:
    step, fingerprint = witness.reflected()
    if step is None:
        return None
    newer = fence.check(directory, fence.own_fence(config), reclaim=False)
    if newer is not None:
        log.warning("not saving this survivor's state: generation %d claimed %s",
                    newer.generation, directory)
        return None
    started = time.monotonic()
    name = f"g{config.restart_count}-w{config.worker_index}-s{step}"
    where = os.path.join(directory, SURVIVORS_DIR, name)
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where, exist_ok=True)
    if samples is not None:
        samples.mark(step)
    checkpointed(model, samples).write(os.path.join(where, "ckpt"))
    if not witness.unchanged_since(fingerprint):
        # Saved from a signal's thread while the main thread waited in its collective: the
        # peer was slow, not gone, the all-reduce completed and the update landed during the
        # write. Labelled `step`, the save may hold the next step or a mix of the two: never
        # restored (no state.json).
        shutil.rmtree(where, ignore_errors=True)
        log.warning("not keeping this survivor's save of step %d: its weights moved while it "
                    "was written (the group's collective completed after all)", step)
        return None
    seconds = round(time.monotonic() - started, 3)
    state: dict[str, Any] = {"step": step, "generation": config.restart_count,
                             "worker": config.worker_index, "jobUid": config.job_uid,
                             "seconds": seconds}
    write_json(os.path.join(where, STATE_FILE), state)
    saved = SurvivorSave(os.path.join(where, "ckpt"), step, config.restart_count,
                         config.worker_index, seconds)
    log.warning("a peer failed: %s %d in %.2fs (%s)", SURVIVOR_SAVED, step, seconds, where)
    return saved
