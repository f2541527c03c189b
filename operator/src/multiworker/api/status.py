"""The MultiWorkerJob status: phase, conditions, restarts and the last failure."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from multiworker.api.schema import Model, Time


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # waiting for Kueue
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Condition(Model):
    """A standard condition; Succeeded and Failed work with `kubectl wait --for=condition=`."""

    type: str
    """Running, Restarting, Suspended, Succeeded or Failed."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str
    """Why, in CamelCase."""
    message: str
    """What happened, in words: which worker, why, what happens next."""
    last_transition_time: Time
    """When status last changed."""


class FailureRecord(Model):
    """The last worker failure or disruption the operator acted on."""

    worker: int
    """Index of the worker that failed first."""
    generation: int
    """Group generation the worker belonged to."""
    reason: str
    """OOMKilled, Error, Evicted, Preempted, Deleted, NodeLost, Unschedulable, ..."""
    exit_code: int | None = None
    """Exit code of the training container, when it exited."""
    message: str
    """Details: last lines of the termination message, or the pod's status message."""
    time: Time
    """When the failure was observed."""
    action: str
    """What the operator did: RestartGroup, RestartGroupWithoutCounting or FailJob."""
    last_step: int | None = None
    """The last training step a worker was known to have completed then: the chief's last
    report, or a survivor's save (runtime: saved when a peer died)."""
    steps_lost: int | None = None
    """Steps trained before the failure that the next group had to train again (lastStep
    less the step it resumed from), once it resumed."""
    startup_error: str | None = Field(default=None, max_length=1024)
    """The shape of the exception that ended the group before it trained a step (exit code,
    type and message, numbers blanked): the next group dying of the same one fails the job
    (spec.restartPolicy.failFastOnRepeatedStartupError)."""


class ProgressStatus(Model):
    """Training progress reported by the workers (GET /progress, polled by the operator)."""

    step: int | None = None
    """Latest training step of the chief (counted from the job's first generation)."""
    epoch: int | None = None
    """Epochs the chief has completed."""
    steps_per_second: float | None = None
    """The chief's training speed over its last steps."""
    loss: float | None = None
    """The chief's latest training loss."""
    accuracy: float | None = None
    """The chief's latest training accuracy, when the script reports one."""
    last_checkpoint_step: int | None = None
    """Step of the last checkpoint saved."""
    resumed_from_step: int | None = None
    """Step the current generation restored from its checkpoint; 0 when it started afresh,
    unset until its chief reports."""
    resumed_from: str | None = Field(default=None, max_length=128)
    """Where that state came from: `checkpoint` (the periodic one), or `survivors of
    generation 3 (workers 0, 2)` (the copy the workers that outlived a peer's death wrote
    together); followed by `; unreadable, passed over: ckpt-N` where newer saves could not be
    read."""
    expected_save_seconds: float | None = None
    """How long writing the model's state once takes on the checkpoint volume, as the chief
    measured it (the state's bytes over the write rate of its last checkpoint, or of a probe
    before it): a group broken by a worker's failure gives its survivors about twice this to
    save a copy of the state together, within spec.restartPolicy.survivorSaveSeconds."""
    updated_at: Time | None = None
    """When the chief finished its latest step."""


HISTORY_LIMIT = 20  # generations kept in status.history: it outlives Events (an hour)
HISTORY_MESSAGE_CHARS = 256


class GenerationRecord(Model):
    """One generation of the worker group, as kept in status.history: when it started, ran and
    ended, why it ended, and what its end cost."""

    generation: int
    """The group generation (status.groupGeneration while it was current)."""
    workers: int
    """Its size: spec.workers, or fewer while spec.elastic had the group shrunk."""
    path: Literal["Created", "InPlace", "Recreate"]
    """How it started: Created (the job's first group, or one after a suspension or a change
    of placement), InPlace (the previous group's own pods, their containers restarted) or
    Recreate (new pods)."""
    trainer_start: Literal["warm", "cold"] | None = None
    """InPlace with spec.restartPolicy.warmStandby: whether the chief's trainer started in a
    spare interpreter that had already imported TensorFlow (warm) or afresh (cold)."""
    started: Time
    """When the operator began it (the restart decision; for the first, the job's first pass)."""
    running: Time | None = None
    """When all its workers were first running."""
    resumed_from_step: int | None = None
    """The step it restored from its checkpoint or a survivor's save; 0: it started afresh."""
    ended: Time | None = None
    """When it ended: the operator's decision to restart, resize or finish."""
    reason: str | None = None
    """Why it ended, in CamelCase: a failure's own reason (OOMKilled, Error, Evicted,
    NodeLost, ...), a resize (Shrunk, Grew), JobSuspended, Evicted or Preempted by Kueue,
    InPlaceRestartAbandoned, or the Succeeded or Failed condition's reason."""
    message: str | None = Field(default=None, max_length=HISTORY_MESSAGE_CHARS)
    """Why, in words (the condition's message, cut to 256 characters)."""
    last_step: int | None = None
    """The last step known done when it ended by a failure."""
    steps_lost: int | None = None
    """Steps it had trained that the next generation had to train again (lastStep less the
    next generation's resumedFromStep), once the next one resumed."""


class JobStatus(BaseModel):
    """Observed state of the job, written only by the operator."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True
    )

    phase: Phase | None = None
    """Pending, Queued (waiting for Kueue), Starting, Running, Restarting, Suspended, Succeeded
    or Failed."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Running, Restarting, Suspended, Succeeded and Failed."""
    observed_generation: int | None = None
    """metadata.generation of the spec this status reflects."""
    group_generation: int = 0
    """Generation of the current worker group: 0 for the first, +1 for each restart or resume."""
    ready: str | None = None
    """Ready workers of the current group out of its size, e.g. 4/4 (2/4 while spec.elastic
    has it shrunk to 2 of 4)."""
    ready_workers: int = 0
    """Workers of the current group that are running and ready."""
    total_workers: int = 0
    """Workers of the current group: spec.workers, fewer while spec.elastic has it shrunk."""
    size: str | None = None
    """An elastic job's group size out of spec.workers, e.g. 2/4 while shrunk to 2 of 4
    (kubectl get's WORKERS column)."""
    group_workers: int | None = None
    """The size spec.elastic gave the current group; unset: spec.workers."""
    admitted_workers: int | None = None
    """The workers Kueue admitted, where it admitted fewer than the Workload asked for
    (spec.elastic's minWorkers: partial admission); the group is no larger."""
    resizes: int | None = None
    """Times spec.elastic changed the group's size (shrunk or grown back); neither restart
    budget is spent on them."""
    last_resize_time: Time | None = None
    """When spec.elastic last changed the group's size."""
    refused_since: Time | None = None
    """spec.elastic: since when the operator has seen some of the group's pods refused by the
    scheduler, on its own clock (a scheduler's clock may be off); the group shrinks once that
    lasted spec.elastic.shrinkAfterSeconds."""
    room_workers: int | None = None
    """While a shrunk group runs: how many workers the nodes' free room holds."""
    room_since: Time | None = None
    """While a shrunk group runs: since when the nodes have had room for more of its workers
    (it grows back once that lasted spec.elastic.growAfterSeconds)."""
    restarts: int = 0
    """Group restarts spent from spec.restartPolicy.maxRestarts."""
    disruptions: int = 0
    """Group restarts caused by disruptions (eviction, preemption, deletion, node loss); these
    do not spend the restart budget."""
    pinned_image: str | None = None
    """The digest every worker's training container runs since an image skew was found
    (spec.imageSkewPolicy PinToChief)."""
    gpu_product: str | None = None
    """The nvidia.com/gpu.product every worker of the current group was placed on."""
    blocked_since: Time | None = None
    """When creating the current group was first held up (pods refused by quota, no GPU
    product with room for it); cleared once its pods are created."""
    bad_progress_reports: int = 0
    """Answers to GET /progress from the current group that could not be read."""
    restart_after: Time | None = None
    """The next group is created no earlier than this (restart backoff)."""
    group_start_time: Time | None = None
    """When every pod of the current group had been created."""
    recovering_since: Time | None = None
    """When the failure that the current restart recovers from was observed."""
    last_recovery_seconds: float | None = None
    """Time from the last failure observed to the new group running."""
    restart_path: str | None = None
    """How the current group was started after a restart: InPlace (the same pods, their
    containers restarted by the kubelet) or Recreate (new pods); the Restarting condition and
    its Event say why Recreate when InPlace was asked for."""
    placing_since: Time | None = None
    """While the group is placed again because the scheduler refused it where it was created
    (ReplaceGroup): when its first placement was made. Its start-up timeout counts from then,
    so a node that comes and goes cannot keep it waiting longer than
    spec.health.startupTimeoutSeconds."""
    in_place_since: Time | None = None
    """While the current group is being restarted in place: since when. The old trainers must
    all stop within a bound, else the group is recreated."""
    last_failure: FailureRecord | None = None
    start_time: Time | None = None
    """When the first group was created."""
    completion_time: Time | None = None
    """When the job succeeded or failed."""
    progress: ProgressStatus | None = None
    stragglers: list[int] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Indexes of workers whose steps per second stay below spec.health.stragglerThreshold
    times the group's median; absent when there are none."""
    history: list[GenerationRecord] | None = Field(default=None, max_length=HISTORY_LIMIT)
    """The group's generations, oldest first (the last 20): when each started, ran and ended,
    why, how it restarted and what it lost (`kubectl mwj status` shows it as a table)."""


class UnreadableStatus(ValueError):
    """The stored status cannot be read (edited by hand, written by another version): acting
    on it as if empty would reset counters, delete running pods and rerun finished jobs."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_status(raw: Mapping[str, Any] | None) -> JobStatus:
    """The status as last written; UnreadableStatus names every field it cannot read."""
    try:
        return JobStatus.model_validate(raw or {})
    except ValidationError as e:
        raise UnreadableStatus([
            "status." + ".".join(str(p) for p in item["loc"]) + f": {item['msg']}"
            for item in e.errors()]) from e
