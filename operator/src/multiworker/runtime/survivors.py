# mypy: disable-error-code="import-untyped"
"""Survivor saves: when a peer dies, the survivors write one copy of the state between them.

In data-parallel MWMS every worker holds the whole model and optimizer, so the state at the
last step is in the survivors' memory when a collective fails because a peer died; ordinary
ops still run then, only collectives fail (measured with TF 2.21: a `tf.train.Checkpoint.write`
of model and optimizer needs none). Every replica is equal, so one copy is enough, and N-1
writers can each write a different part of it: the bytes written per failure are the state's
size whatever the group's size, in about that size over the volume's bandwidth.

The copy is `<MWJ_CHECKPOINT_DIR>/survivors/g<generation>-s<step>/`. The state (the model's
and the optimizer's variables, and a run's sample count) is cut into parts of about equal
bytes, the same cut on every worker (the same variables in the same order: plan_parts).
Survivors claim parts without a collective — the file system is the one thing they still
share — by creating `part-<i>-of-<n>.claim` only if absent, and write each part they claimed
to a file of their own: its variables' bytes one after another, synced before the part is
published. A part is done when its marker `part-<i>-of-<n>.done` is linked into place (the
first writer's wins; it names the file and each variable's dtype and shape). A survivor
that finds every part claimed waits for the others; a part still not done after a few
part-writes' time (its writer died or was killed) it writes too. The copy is
complete when every part's marker is there; the next group restores only complete copies
(newest()), and never one a survivor found its weights moved under (`poisoned`).

Raw bytes from the variables' own buffers, not a TensorFlow checkpoint, whose writer
serializes and checksums every tensor: at 150 M parameters and 4 workers the copy took 2.2 s
as checkpoints and 1.1-1.5 s raw, about what the volume takes (tests/bench/
bench_survivor_size.py). A part is published only once synced, and its restore checks its
size and every variable's dtype and shape, so a torn or foreign part is never read.

The step its weights reflect is not the optimizer's counter: Keras 3 may count a step whose
gradient all-reduce then failed (weights at N, iterations at N+1), and a collective after the
update (the logs' reduction) may fail once the weights moved (N+1). So after every step the
witness keeps the step and a sample of the weights (a few thousand elements of each trained
variable: a step's update lands on every variable at once, after its one all-reduce of the
gradients, and moves every variable it trains); at the failure the weights either still match
it (step N) or do not (N+1). A sample, not a sum of every weight: that cost grows with the
model, ~10% of a step at 100 M parameters on CPU (tests/bench/bench_survivor_size.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from multiworker.api.contract import SURVIVOR_SAVED
from multiworker.runtime import fence
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.files import read_json, write_json
from multiworker.runtime.samples import SampleCount

log = logging.getLogger(__name__)

SURVIVORS_DIR = "survivors"
POISONED = "poisoned"  # a survivor's weights moved while it wrote: the copy is never restored
# Training counts as stuck (in a collective whose peer is gone) once no step completed for
# this long, or for three of its usual steps if they are longer.
STUCK_SECONDS = 2.0
# Parts per survivor a group of N expects (N-1 of them): a survivor that comes late (its
# collective failed seconds after a neighbour's) or dies leaves a smaller share.
PARTS_PER_SURVIVOR = 2
# A part claimed by another survivor and not done after this many part-writes' time (or
# MIN_STEAL_SECONDS) is written again by a survivor with nothing left to do.
STEAL_AFTER_PARTS = 3.0
MIN_STEAL_SECONDS = 2.0
WAIT_POLL_SECONDS = 0.05
SAMPLED_ELEMENTS = 4096  # per trained variable, for the witness
_COPY = re.compile(r"^g(\d+)-s(\d+)$")
_STEP = re.compile(r"^g\d+-(?:w\d+-)?s(\d+)$")


@dataclass(frozen=True)
class SurvivorSave:
    """A complete copy of the state, the step its weights reflect, the generation whose
    survivors wrote it, and (for this survivor's own save) what it wrote of it."""

    path: str  # the copy's directory
    step: int
    generation: int
    writers: tuple[int, ...]  # the workers whose parts the copy holds
    seconds: float = 0.0  # this survivor's save, from its start to the copy's completion
    bytes_written: int = 0  # by this survivor
    parts_written: int = 0  # by this survivor

    def describe(self) -> str:
        workers = ", ".join(str(w) for w in self.writers)
        return f"survivors of generation {self.generation} (workers {workers})"


def state_variables(model: keras.Model, samples: SampleCount | None) -> list[tf.Variable]:
    """The variables a copy holds, in an order every worker of the job shares: the model's
    (weights, and non-trained state such as moving averages), the optimizer's (its counter,
    learning rate and slots), and the sample count of a run that keeps one."""
    found: list[tf.Variable] = []
    seen: set[int] = set()
    for variable in [*model.variables, *model.optimizer.variables]:
        value = getattr(variable, "value", variable)  # a Keras variable holds a tf.Variable
        if id(value) not in seen:
            seen.add(id(value))
            found.append(value)
    if samples is not None:
        found.append(samples.variable)
    return found


def state_bytes(variables: Sequence[tf.Variable]) -> int:
    return int(sum(_size(v) for v in variables))


def _size(variable: tf.Variable) -> int:
    return int(variable.shape.num_elements() or 0) * int(variable.dtype.size)


def plan_parts(sizes: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """Cuts variables of `sizes` bytes (in their shared order) into at most `count` runs of
    consecutive ones of about equal bytes; a variable is never split, so one larger than a
    part's share makes a part of its own. Every variable is in exactly one part."""
    if not sizes:
        return []
    count = max(1, min(count, len(sizes)))
    total = sum(sizes)
    parts: list[tuple[int, ...]] = []
    current: list[int] = []
    done = 0  # bytes of the variables before `index`
    for index, size in enumerate(sizes):
        closing = len(parts) < count - 1 and current
        target = total * (len(parts) + 1) / count  # where the current part should end
        # Close it before this variable if taking it would end further from the target, or
        # if every variable left must start a part of its own.
        if closing and (abs(done + size - target) > abs(done - target)
                        or len(sizes) - index == count - len(parts) - 1):
            parts.append(tuple(current))
            current = []
        current.append(index)
        done += size
    parts.append(tuple(current))
    return parts


def parts_for(workers: int) -> int:
    """How many parts a group of `workers` cuts its state into (plan_parts caps it at the
    number of variables)."""
    return PARTS_PER_SURVIVOR * max(1, workers - 1)


def claim_order(worker: int, workers: int, count: int) -> list[int]:
    """The parts worker `worker` tries to claim, in order: its own share first (the survivors
    start apart), then the rest."""
    start = worker * count // max(1, workers)
    return [(start + i) % count for i in range(count)]


def newest(directory: str, job_uid: str) -> SurvivorSave | None:
    """The complete copy of job `job_uid` of the highest step in `directory` (a later
    generation first among equals); incomplete, poisoned and another job's are skipped."""
    root = os.path.join(directory, SURVIVORS_DIR)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    found = [copy for name in names if (copy := _complete(os.path.join(root, name), job_uid))]
    return max(found, key=lambda c: (c.step, c.generation), default=None)


def prune(directory: str, saved_step: int) -> None:
    """Removes the copies a periodic checkpoint at `saved_step` makes redundant (the chief,
    after each save): those of no higher step (and the one-replica-a-worker saves of
    g<gen>-w<worker>-s<step> an earlier runtime wrote)."""
    root = os.path.join(directory, SURVIVORS_DIR)
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        match = _STEP.search(name)
        if match and int(match[1]) <= saved_step:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


@dataclass(frozen=True)
class _Done:
    """A done part, as its marker says."""

    index: int
    count: int
    file: str  # the part's bytes, relative to the copy
    variables: tuple[int, ...]
    layout: tuple[tuple[str, tuple[int, ...]], ...]  # each variable's dtype and shape
    writer: int
    seconds: float


def _marker(copy: str, index: int, count: int, suffix: str) -> str:
    return os.path.join(copy, f"part-{index}-of-{count}.{suffix}")


def _read_done(path: str, job_uid: str, generation: int, step: int) -> _Done | None:
    try:
        doc = read_json(path)
        done = _Done(int(doc["part"]), int(doc["count"]), str(doc["file"]),
                     tuple(int(i) for i in doc["variables"]),
                     tuple((str(d), tuple(int(n) for n in shape)) for d, shape in doc["layout"]),
                     int(doc["writer"]), float(doc.get("seconds", 0.0)))
        same = (doc["jobUid"], int(doc["generation"]), int(doc["step"])) == \
            (job_uid, generation, step)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable, or not raw parts
    ok = same and os.sep not in done.file and len(done.layout) == len(done.variables)
    return done if ok else None


def _parts_done(copy: str, job_uid: str, generation: int, step: int) -> dict[int, _Done]:
    found: dict[int, _Done] = {}
    try:
        names = os.listdir(copy)
    except OSError:
        return found
    for name in names:
        if name.startswith("part-") and name.endswith(".done"):
            done = _read_done(os.path.join(copy, name), job_uid, generation, step)
            if done is not None:
                found[done.index] = done
    return found


def _complete(copy: str, job_uid: str) -> SurvivorSave | None:
    match = _COPY.match(os.path.basename(copy))
    if match is None or os.path.exists(os.path.join(copy, POISONED)):
        return None
    generation, step = int(match[1]), int(match[2])
    parts = _parts_done(copy, job_uid, generation, step)
    counts = {p.count for p in parts.values()}
    if len(counts) != 1 or set(parts) != set(range(counts.pop())):
        return None
    variables = sorted(i for p in parts.values() for i in p.variables)
    if variables != list(range(len(variables))):
        return None
    return SurvivorSave(copy, step, generation, tuple(sorted({p.writer for p in parts.values()})))


def restore(copy: SurvivorSave, variables: Sequence[tf.Variable], job_uid: str) -> None:
    """Reads a complete copy into `variables` (state_variables of the restoring worker), part
    by part; raises (ValueError, or TensorFlow's own error) when the copy does not hold
    exactly these variables: a model changed since, or files cut short."""
    parts = _parts_done(copy.path, job_uid, copy.generation, copy.step)
    held = sorted(i for p in parts.values() for i in p.variables)
    if held != list(range(len(variables))):
        raise ValueError(f"the copy holds {len(held)} variables, this model has "
                         f"{len(variables)}")
    for part in sorted(parts.values(), key=lambda p: p.index):
        _read_part(os.path.join(copy.path, part.file), variables, part)


def _write_part(path: str, variables: Sequence[tf.Variable],
                indexes: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Writes the bytes of `variables[indexes]`, one after another, to `path` and syncs them
    (a part published before its data is on the storage could read as torn after a node's
    crash); returns each one's dtype and shape."""
    layout = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for index in indexes:
            variable = variables[index]
            # The variable's own buffer, not a copy (numpy() copies: at 600 MB a survivor that
            # cost as much as the write); an update landing meanwhile writes a new buffer.
            data = np.asarray(variable.read_value()).reshape(-1).view(np.uint8).data
            while data:
                data = data[os.write(fd, data):]
            layout.append((variable.dtype.name, variable.shape.as_list()))
        os.fsync(fd)
    finally:
        os.close(fd)
    return layout


def _read_part(path: str, variables: Sequence[tf.Variable], part: _Done) -> None:
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size != sum(
                _size(variables[i]) for i in part.variables):
            raise ValueError(f"{path} does not hold this model's variables {part.variables}")
        for index, (dtype, shape) in zip(part.variables, part.layout, strict=True):
            variable = variables[index]
            if (dtype, shape) != (variable.dtype.name, tuple(variable.shape.as_list())):
                raise ValueError(f"{path}: variable {index} is {dtype}{list(shape)}, this "
                                 f"model's {variable.dtype.name}{variable.shape.as_list()}")
            count = int(np.prod(shape, dtype=np.int64))
            value = np.fromfile(file, dtype=variable.dtype.as_numpy_dtype, count=count)
            if value.size != count:
                raise ValueError(f"{path} is cut short at variable {index}")
            variable.assign(value.reshape(shape))


class Witness:
    """The last completed step and a sample of the weights it left (kept after each step;
    read without a collective: a MirroredVariable reads its local copy)."""

    def __init__(self, model: keras.Model) -> None:
        self._model = model
        self._sample: Any = None  # built at the first step: a model builds lazily
        self._moved: Any = None
        self.step: int | None = None
        self._seen: Any = None
        self._at = time.monotonic()  # when the last step completed
        self._usual = 0.0  # a step's usual duration (moving average)
        self.lock = threading.Lock()  # one save at a time (the main thread or a signal's)
        self.saved: SurvivorSave | None = None

    def _build(self) -> None:
        variables = [getattr(v, "value", v) for v in self._model.trainable_variables]

        def sample() -> list[tf.Tensor]:
            # Evenly spaced elements of each variable (all of a small one).
            return [tf.reshape(v, [-1])[::max(1, int(v.shape.num_elements() or 1)
                                              // SAMPLED_ELEMENTS)] for v in variables]

        def moved(seen: list[tf.Tensor]) -> tf.Tensor:
            now = sample()
            return tf.reduce_any(tf.stack([tf.reduce_any(tf.not_equal(a, b))
                                           for a, b in zip(now, seen, strict=True)]))

        self._sample = tf.function(sample) if variables else False
        self._moved = tf.function(moved) if variables else False

    def step_done(self, step: int) -> None:
        if self._sample is None:
            self._build()
        first = self.step is None
        self.step = step
        self._seen = self._sample() if self._sample else None
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
        this generation, so nothing newer than what it restored), and the sample it was
        judged by (None: none)."""
        if self.step is None:
            return None, None
        if not self._sample or self._seen is None:
            return self.step, None
        now = self._sample()
        return (self.step + 1 if bool(self._moved(self._seen)) else self.step), now

    def unchanged_since(self, sample: Any) -> bool:
        """Whether the weights still hold `sample` (from reflected()); None: cannot tell, so
        yes."""
        return sample is None or not bool(self._moved(sample))


def save(model: keras.Model, config: RuntimeConfig, witness: Witness,
         samples: SampleCount | None = None) -> SurvivorSave | None:
    """Writes this survivor's share of the group's copy, and the sample count of a run that
    keeps one (fenced: never once a newer generation claimed the directory), and waits until
    the copy is complete; None when there is nothing newer to keep, it may not write, or its
    weights moved while it wrote."""
    directory = config.checkpoint_dir
    if directory is None or not config.survivor_saves:
        return None
    with witness.lock:
        if witness.saved is None:
            witness.saved = _write(model, config, witness, directory, samples)
        return witness.saved


def _write(model: keras.Model, config: RuntimeConfig, witness: Witness, directory: str,
           samples: SampleCount | None) -> SurvivorSave | None:
    step, sample = witness.reflected()
    if step is None:
        return None
    newer = fence.check(directory, fence.own_fence(config), reclaim=False)
    if newer is not None:
        log.warning("not saving this survivor's state: generation %d claimed %s",
                    newer.generation, directory)
        return None
    started = time.monotonic()
    copy = os.path.join(directory, SURVIVORS_DIR, f"g{config.restart_count}-s{step}")
    os.makedirs(copy, exist_ok=True)
    if samples is not None:
        samples.mark(step)
    variables = state_variables(model, samples)
    writer = _CopyWriter(copy, config, step, variables,
                         moved=lambda: not witness.unchanged_since(sample))
    if not writer.run():
        # Saved from a signal's thread while the main thread waited in its collective: the
        # peer was slow, not gone, the all-reduce completed and the update landed during the
        # write. Labelled `step`, the copy may hold the next step or a mix of the two: never
        # restored.
        log.warning("not keeping the survivors' copy of step %d: this worker's weights moved "
                    "while it was written (the group's collective completed after all)", step)
        return None
    seconds = round(time.monotonic() - started, 3)
    complete = _complete(copy, config.job_uid)
    writers = complete.writers if complete else (config.worker_index,)
    saved = SurvivorSave(copy, step, config.restart_count, writers, seconds,
                         writer.bytes_written, len(writer.written))
    log.warning("a peer failed: %s %d in %.2fs, with workers %s (this one wrote %d of %d parts, "
                "%.1f MB; %s)", SURVIVOR_SAVED, step, seconds,
                ", ".join(map(str, writers)), len(writer.written), len(writer.parts),
                writer.bytes_written / 1e6, copy)
    return saved


class _CopyWriter:
    """One survivor's work on the group's copy: claim and write parts, then wait for the
    others' and write those whose writer is gone."""

    def __init__(self, copy: str, config: RuntimeConfig, step: int,
                 variables: Sequence[tf.Variable], moved: Callable[[], bool]) -> None:
        self.copy = copy
        self.config = config
        self.step = step
        self.variables = variables
        self.moved = moved
        self.parts = plan_parts([_size(v) for v in variables], parts_for(config.num_workers))
        self.written: list[int] = []
        self.bytes_written = 0
        self.part_seconds: list[float] = []

    def run(self) -> bool:
        """Writes until the copy is complete; False when the weights moved (the copy is
        poisoned for everyone)."""
        count = len(self.parts)
        for index in claim_order(self.config.worker_index, self.config.num_workers, count):
            if self._poisoned():
                return False
            if index not in self._done() and self._claim(index) and not self._write(index):
                return False
        first_seen: dict[int, float] = {}
        while True:
            if self._poisoned():
                return False
            missing = [i for i in range(count) if i not in self._done()]
            if not missing:
                return True
            now = time.monotonic()
            for index in missing:
                since = first_seen.setdefault(index, now)
                if now - since > self._steal_after() and not self._write(index):
                    return False
            time.sleep(WAIT_POLL_SECONDS)

    def _steal_after(self) -> float:
        slowest = max(self.part_seconds, default=0.0)
        others = [d.seconds for d in self._done().values()]
        return max(MIN_STEAL_SECONDS, STEAL_AFTER_PARTS * max([slowest, *others]))

    def _done(self) -> dict[int, _Done]:
        return _parts_done(self.copy, self.config.job_uid, self.config.restart_count, self.step)

    def _poisoned(self) -> bool:
        return os.path.exists(os.path.join(self.copy, POISONED))

    def _claim(self, index: int) -> bool:
        try:
            fd = os.open(_marker(self.copy, index, len(self.parts), "claim"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as file:
            file.write(f"{self.config.worker_index}\n")
        return True

    def _write(self, index: int) -> bool:
        """Writes part `index` and publishes it (unless another writer's was first); False
        when the weights moved meanwhile."""
        started = time.monotonic()
        count = len(self.parts)
        name = f"part-{index}-of-{count}.w{self.config.worker_index}"
        where = os.path.join(self.copy, name)
        layout = _write_part(where, self.variables, self.parts[index])
        written = os.path.getsize(where)
        if self.moved():
            write_json(os.path.join(self.copy, POISONED), {"worker": self.config.worker_index})
            return False
        seconds = round(time.monotonic() - started, 3)
        marker = _marker(self.copy, index, count, "done")
        temp = f"{marker}.w{self.config.worker_index}"
        write_json(temp, {"jobUid": self.config.job_uid, "generation": self.config.restart_count,
                          "step": self.step, "part": index, "count": count, "file": name,
                          "variables": list(self.parts[index]), "layout": layout,
                          "writer": self.config.worker_index, "seconds": seconds})
        try:
            os.link(temp, marker)  # the first writer's marker wins
        except FileExistsError:
            with contextlib.suppress(OSError):
                os.unlink(where)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        self.written.append(index)
        self.part_seconds.append(seconds)
        self.bytes_written += written
        return True

