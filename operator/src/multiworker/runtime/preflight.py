"""The preflight: before the strategy is built, the workers compare what they run, and a group
that is not identical stops with exit 2 naming the first difference ("worker-2 runs
TensorFlow 2.20.0, worker-0 2.21.0"), instead of failing later as a hang in the first
all-reduce, an incarnation mismatch or a checkpoint that will not load.

How: every worker serves its fingerprint on GET /preflight (the progress server: it is up
before TensorFlow's gRPC server exists, and needs no collective). Worker 0 fetches every other
worker's, compares each with its own in index order and publishes a verdict there; the others
wait for that verdict, so every worker exits with the same message. Worker 0 moves on (to the
strategy, or to exit 2) only once every worker has fetched the verdict, since inside the MWMS
constructor it can no longer answer HTTP. Stdlib only; fingerprint.py reads TensorFlow.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from multiworker.api.contract import MWJ_TEST_FINGERPRINT_OVERRIDE, PREFLIGHT_PATH
from multiworker.runtime.config import RuntimeConfig
from multiworker.runtime.errors import ConfigError
from multiworker.runtime.reach import Reach

PENDING, PASSED, FAILED = "pending", "passed", "failed"


@dataclass(frozen=True)
class Fingerprint:
    """What one worker runs. `None`: not there (a CPU build has no CUDA)."""

    tensorflow: str
    python: str
    keras: str | None
    cuda: str | None
    cudnn: str | None
    multiworker: str | None
    gpu_models: tuple[str, ...] = ()  # one name per visible GPU, sorted

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_models", tuple(sorted(self.gpu_models)))

    @property
    def software(self) -> dict[str, str | None]:
        """The image-relevant part: the same on every worker that runs one image."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gpu_models"}

    def to_json(self) -> dict[str, Any]:
        models = list(self.gpu_models)
        devices = {"gpuCount": len(models), "gpuModels": models}
        return {"software": self.software, "devices": devices}

    @classmethod
    def from_json(cls, raw: Any) -> Fingerprint:
        """Raises ValueError for anything but a fingerprint `to_json` could have written."""
        software = raw.get("software") if isinstance(raw, dict) else None
        devices = raw.get("devices") if isinstance(raw, dict) else None
        if not isinstance(software, dict) or not isinstance(devices, dict):
            raise ValueError("not a fingerprint")
        return _checked({**software, "gpuModels": devices.get("gpuModels")})


# Compared in this order; the first that differs is the one reported.
_COMPARED = (
    ("tensorflow", "TensorFlow"),
    ("python", "Python"),
    ("keras", "Keras"),
    ("cuda", "CUDA"),
    ("cudnn", "cuDNN"),
    ("multiworker", "multiworker"),
)


def difference(index: int, theirs: Fingerprint, chief: Fingerprint) -> str | None:
    """'worker-2 runs TensorFlow 2.20.0, worker-0 2.21.0': the first way `theirs` differs."""
    for name, label in _COMPARED:
        if getattr(theirs, name) != getattr(chief, name):
            ours, other = _shown(getattr(chief, name)), _shown(getattr(theirs, name))
            return f"worker-{index} runs {label} {other}, worker-0 {ours}"
    count, chief_count = len(theirs.gpu_models), len(chief.gpu_models)
    if count != chief_count:
        return f"worker-{index} sees {count} GPU(s), worker-0 {chief_count}"
    if theirs.gpu_models != chief.gpu_models:
        return f"worker-{index} has GPUs {_models(theirs)}, worker-0 {_models(chief)}"
    return None


def first_mismatch(chief: Fingerprint, others: Mapping[int, Fingerprint | None]) -> str | None:
    """The lowest-index worker that differs from worker 0 (None: serves no /preflight), and
    how many more do."""
    found = []
    for index in sorted(others):
        theirs = others[index]
        if theirs is None:
            found.append(
                f"worker-{index} serves no {PREFLIGHT_PATH} (an older multiworker runtime), "
                f"worker-0 runs multiworker {_shown(chief.multiworker)}"
            )
        elif (problem := difference(index, theirs, chief)) is not None:
            found.append(problem)
    if not found:
        return None
    more = f" (and {len(found) - 1} more worker(s) differ from worker-0)" if len(found) > 1 else ""
    return found[0] + more


def with_override(fingerprint: Fingerprint, raw: str) -> Fingerprint:
    """Applies MWJ_TEST_FINGERPRINT_OVERRIDE, a JSON object of fields to report instead
    (tensorflow, python, keras, cuda, cudnn, multiworker, gpuModels): a skewed group for tests."""
    try:
        changes = json.loads(raw)
        if not isinstance(changes, dict):
            raise ValueError("not a JSON object")
        flat = {**fingerprint.software, "gpuModels": list(fingerprint.gpu_models), **changes}
        return _checked(flat)
    except ValueError as e:
        raise ConfigError([f"{MWJ_TEST_FINGERPRINT_OVERRIDE}: {e}"]) from e


class GroupCheck:
    """One worker's side of the preflight; `document` is its answer to GET /preflight."""

    def __init__(self, config: RuntimeConfig, mine: Fingerprint) -> None:
        self._config = config
        self._mine = mine
        self._lock = threading.Lock()
        self._reports: dict[int, Fingerprint | None] = {}  # worker 0: the others'
        self._verdict = PENDING
        self._message: str | None = None
        self._seen_by: set[int] = set()

    def document(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """Also records which peers have fetched a final verdict (`?worker=i&generation=g`)."""
        worker, generation = _number(query, "worker"), _number(query, "generation")
        with self._lock:
            if (
                self._verdict != PENDING
                and worker is not None
                and generation == self._config.restart_count
            ):
                self._seen_by.add(worker)
            return {
                "workerIndex": self._config.worker_index,
                "generation": self._config.restart_count,
                "fingerprint": self._mine.to_json(),
                "verdict": self._verdict,
                "message": self._message,
            }

    def query(self) -> str:
        """What this worker appends to worker 0's /preflight: who is asking."""
        config = self._config
        return f"{PREFLIGHT_PATH}?worker={config.worker_index}&generation={config.restart_count}"

    # Worker 0's side.

    def take_report(self, index: int, raw: Any) -> tuple[Reach, str]:
        problem = _identity_problem(raw, index, self._config.restart_count)
        if problem:
            return Reach.NOT_READY, problem
        try:
            fingerprint = Fingerprint.from_json(raw.get("fingerprint"))
        except ValueError as e:
            return Reach.NOT_READY, f"its {PREFLIGHT_PATH} report is malformed ({e})"
        with self._lock:
            self._reports[index] = fingerprint
        return Reach.READY, "reported its fingerprint"

    def take_no_preflight(self, index: int) -> tuple[Reach, str]:
        """The peer answers HTTP but has no /preflight: a runtime that predates it."""
        with self._lock:
            self._reports[index] = None
        return Reach.READY, f"serves no {PREFLIGHT_PATH}"

    def decide(self) -> str | None:
        """Publishes the verdict on the reports so far; returns the difference, if any."""
        with self._lock:
            self._message = first_mismatch(self._mine, self._reports)
            self._verdict = FAILED if self._message else PASSED
            return self._message

    def seen_by(self, index: int) -> tuple[Reach, str]:
        with self._lock:
            if index in self._seen_by:
                return Reach.READY, "fetched the verdict"
        return Reach.NOT_READY, "has not fetched worker-0's preflight verdict yet"

    # The other workers' side.

    def take_verdict(self, raw: Any) -> tuple[Reach, str]:
        """Worker 0's answer: READY once it decided (a failure is kept in `failure`)."""
        problem = _identity_problem(raw, 0, self._config.restart_count)
        if problem:
            return Reach.NOT_READY, problem
        verdict, message = raw.get("verdict"), raw.get("message")
        if verdict == FAILED:
            with self._lock:
                self._message = str(message)
            return Reach.READY, f"preflight failed: {message}"
        if verdict == PASSED:
            return Reach.READY, "preflight passed"
        return Reach.NOT_READY, "preflight verdict pending (worker-0 waits for every report)"

    def take_chief_without_preflight(self) -> tuple[Reach, str]:
        with self._lock:
            self._message = (
                f"worker-0 serves no {PREFLIGHT_PATH} (an older multiworker runtime), "
                f"worker-{self._config.worker_index} runs multiworker "
                f"{_shown(self._mine.multiworker)}"
            )
        return Reach.READY, self._message

    @property
    def failure(self) -> str | None:
        """The difference found by worker 0 (or about it), once known."""
        with self._lock:
            return self._message


def _checked(flat: Mapping[str, Any]) -> Fingerprint:
    """A Fingerprint from flat JSON fields, each checked for its type."""
    values: dict[str, Any] = {}
    for name, _ in _COMPARED:
        value = flat.get(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or null, got {value!r}")
        values[name] = value
    if values["tensorflow"] is None or values["python"] is None:
        raise ValueError("tensorflow and python are required")
    models = flat.get("gpuModels")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ValueError(f"gpuModels must be a list of strings, got {models!r}")
    unknown = set(flat) - set(values) - {"gpuModels"}
    if unknown:
        raise ValueError(f"unknown fields {', '.join(sorted(unknown))}")
    return Fingerprint(**values, gpu_models=tuple(models))


def _identity_problem(raw: Any, index: int, generation: int) -> str | None:
    """A report from another worker or generation (a stale pod, a reused IP) is not its."""
    if not isinstance(raw, dict):
        return f"its {PREFLIGHT_PATH} answer is not a JSON object"
    if raw.get("workerIndex") != index or raw.get("generation") != generation:
        return (
            f"answers as worker-{raw.get('workerIndex')} of generation {raw.get('generation')}, "
            f"not worker-{index} of generation {generation}"
        )
    return None


def _number(query: Mapping[str, list[str]], name: str) -> int | None:
    values = query.get(name) or []
    return int(values[0]) if values and values[0].isdigit() else None


def _shown(value: str | None) -> str:
    return "none" if value is None else value


def _models(fingerprint: Fingerprint) -> str:
    """'2x NVIDIA A100-SXM4-40GB + 1x NVIDIA H100 80GB HBM3'."""
    counts: dict[str, int] = {}
    for model in fingerprint.gpu_models:
        counts[model] = counts.get(model, 0) + 1
    return " + ".join(f"{n}x {model}" for model, n in counts.items()) or "none"
