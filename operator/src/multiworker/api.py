"""The MultiWorkerJob API as pydantic models: the single source of the CRD schema (see crd.py).

Field docstrings become the CRD's descriptions (`kubectl explain`); `cel(...)` rules become
`x-kubernetes-validations`, and each has a pydantic twin so the operator reports the same
problem with the same words when the CRD did not catch it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from multiworker import names


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC; milliseconds only when there are any (recovery times need them)."""
    value = value.astimezone(UTC)
    if value.microsecond == 0:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


Time = Annotated[datetime, PlainSerializer(format_time, return_type=str, when_used="json")]


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message always names the field."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        frozen=True,
    )


class _OpenModel(_Model):
    """Part of a core/v1 object: the fields we check are typed, everything else is kept."""

    model_config = ConfigDict(extra="allow")


class ExitCodeAction(StrEnum):
    FAIL_JOB = "FailJob"
    RESTART_GROUP = "RestartGroup"


class SuccessPolicy(StrEnum):
    CHIEF_SUCCEEDED = "ChiefSucceeded"
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"


class CleanPodPolicy(StrEnum):
    RUNNING = "Running"
    ALL = "All"


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


# --- spec.template: a core/v1 PodTemplateSpec, typed only where the operator relies on it ---


class Container(_OpenModel):
    """A core/v1 Container. Only name and image are checked here; the API server validates
    the rest when the operator creates the pods."""

    name: str = Field(min_length=1)
    """Container name; the one named `tensorflow` (or else the first) trains and gets the env."""
    image: str = Field(min_length=1)
    """Container image, e.g. multiworker.local/worker:dev."""


class TemplateMetadata(_OpenModel):
    """Labels and annotations copied onto every worker pod."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "!has(self.labels) || self.labels.all(k, !k.startsWith('multiworker.dev/'))",
                "spec.template.metadata.labels: keys under multiworker.dev/ are reserved for "
                "the operator",
                ".labels",
            )
        )
    )

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels for every worker pod; keys under multiworker.dev/ are set by the operator."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations for every worker pod."""




class PodSpec(_OpenModel):
    """A core/v1 PodSpec, the same for every worker (GPUs via resources.limits
    nvidia.com/gpu). hostname, subdomain and restartPolicy are set by the operator."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "!has(self.restartPolicy) || self.restartPolicy == 'Never'",
                "spec.template.spec.restartPolicy must be Never or unset: the operator restarts "
                "the whole group, never one worker",
                ".restartPolicy",
            ),
            cel(
                "!has(self.hostname) && !has(self.subdomain)",
                "spec.template.spec.hostname and subdomain must be unset: the operator gives "
                "each worker its DNS name",
            ),
        )
    )

    containers: list[Container] = Field(min_length=1)
    """The pod's containers; at least one."""
    restart_policy: str | None = None
    """Must be Never or unset: failures restart the whole group, never one container."""
    hostname: str | None = None
    """Must be unset: the operator names each worker <job>-worker-<index>."""
    subdomain: str | None = None
    """Must be unset: the operator puts every worker in the job's headless Service."""

    @model_validator(mode="after")
    def _operator_owned_fields(self) -> PodSpec:
        if self.restart_policy not in (None, "Never"):
            raise ValueError(
                f"restartPolicy {self.restart_policy!r} must be Never or unset: "
                "the operator restarts the whole group, never one worker"
            )
        if self.hostname is not None or self.subdomain is not None:
            raise ValueError("hostname and subdomain must be unset: the operator sets them")
        return self


class PodTemplate(_OpenModel):
    """A full core/v1 PodTemplateSpec for every worker. The container named `tensorflow` (or
    the first) trains and gets TF_CONFIG and the MWJ_* environment. Changes take effect when
    the next group starts (after a restart or a resume)."""

    metadata: TemplateMetadata | None = None
    """Labels and annotations for every worker pod."""
    spec: PodSpec
    """The worker pod spec."""

    @model_validator(mode="after")
    def _no_reserved_labels(self) -> PodTemplate:
        labels = self.metadata.labels if self.metadata else {}
        reserved = sorted(k for k in labels if k.startswith(f"{names.GROUP}/"))
        if reserved:
            raise ValueError(f"metadata.labels {reserved} are reserved for the operator")
        return self

    def trainer_container(self) -> str:
        """The container that trains: `tensorflow` if present, else the first one."""
        container_names = [c.name for c in self.spec.containers]
        if names.TRAINER_CONTAINER in container_names:
            return names.TRAINER_CONTAINER
        return container_names[0]

    def as_dict(self) -> dict[str, Any]:
        """The template exactly as the user wrote it (unknown fields included)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --- the rest of the spec ---


class CheckpointSpec(_Model):
    """A shared volume every worker mounts; the chief saves checkpoints there and every new
    group restores from it (MWJ_CHECKPOINT_DIR)."""

    claim_name: str = Field(min_length=1, max_length=253)
    """Name of an existing PersistentVolumeClaim in the job's namespace (ReadWriteMany when
    workers run on several nodes)."""
    mount_path: str = Field(default="/checkpoints", pattern="^/")
    """Absolute path where the claim is mounted in the training container."""


class ExitCodeRule(_Model):
    """What to do when the training container exits with one of `values`."""

    action: ExitCodeAction
    """FailJob fails the job at once; RestartGroup restarts the whole group and spends one
    restart of spec.restartPolicy.maxRestarts."""
    values: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        min_length=1, max_length=255, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Exit codes (1-255) this rule matches."""


class RestartPolicy(_Model):
    """When and how fast a failed group is restarted. A failure of any worker restarts the
    whole group; disruptions that are not the job's fault (pod evicted, preempted or deleted,
    node lost) restart it without spending a restart."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "self.maxBackoffSeconds >= self.backoffSeconds",
                "spec.restartPolicy.maxBackoffSeconds must be at least backoffSeconds",
                ".maxBackoffSeconds",
            )
        )
    )

    max_restarts: int = Field(default=3, ge=0, le=10000)
    """How many times a failed group is restarted before the job fails."""
    backoff_seconds: int = Field(default=10, ge=0, le=86400)
    """Wait before the first restart; doubles with every restart spent."""
    max_backoff_seconds: int = Field(default=300, ge=0, le=86400)
    """Upper bound of the exponential backoff."""
    on_exit_codes: list[ExitCodeRule] = Field(default_factory=list, max_length=32)
    """Rules by exit code of the training container, first match wins."""
    default_action: ExitCodeAction = ExitCodeAction.RESTART_GROUP
    """Action for a non-zero exit code no rule matches."""

    @model_validator(mode="after")
    def _backoff_cap(self) -> RestartPolicy:
        if self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError("maxBackoffSeconds must be at least backoffSeconds")
        return self

    def action_for(self, exit_code: int) -> ExitCodeAction:
        for rule in self.on_exit_codes:
            if exit_code in rule.values:
                return rule.action
        return self.default_action


class HealthSpec(_Model):
    """Detection of workers that cannot start, hang or straggle."""

    progress_timeout_seconds: int | None = Field(default=None, ge=1)
    """Restart the group when no worker reports a new step for this long (hang detection).
    Unset or null turns it off."""
    progress_port: int = Field(default=8471, ge=1, le=65535)
    """Port where workers serve GET /progress (MWJ_PROGRESS_PORT)."""
    startup_timeout_seconds: int | None = Field(default=300, ge=1)
    """Fail the job when a worker cannot start for this long (unschedulable, image pull
    errors, bad container config); null waits forever."""
    straggler_threshold: float | None = Field(default=None, gt=0, le=1)
    """Report a worker as a straggler when its steps per second fall below this fraction of
    the group's median. Unset turns it off."""
    peer_timeout_seconds: int = Field(default=300, ge=1)
    """How long a starting worker waits for its peers (MWJ_PEER_TIMEOUT_SECONDS)."""
    collective_timeout_seconds: int = Field(default=300, ge=1)
    """Abort a collective whose peer is gone after this long (MWJ_COLLECTIVE_TIMEOUT_SECONDS)."""


def _object_default() -> dict[str, Any]:
    """Let the API server default a nested object so its own defaults show in the stored job."""
    return {"default": {}}


class MultiWorkerJobSpec(_Model):
    """A TensorFlow MultiWorkerMirroredStrategy job: `workers` identical pods that train as
    one group and are restarted together."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "self.health.progressPort != self.port",
                "spec.health.progressPort must differ from spec.port",
                ".health.progressPort",
            ),
            cel(
                "self.suspend || oldSelf.suspend || self.workers == oldSelf.workers",
                "spec.workers can only change while the job is suspended",
                ".workers",
            ),
        )
    )

    workers: int = Field(ge=1, le=1024)
    """Number of workers (1-1024). Worker 0 is the chief."""
    template: PodTemplate
    port: int = Field(default=2222, ge=1, le=65535)
    """Port the workers' TensorFlow servers listen on (in TF_CONFIG)."""
    checkpoint: CheckpointSpec | None = None
    restart_policy: RestartPolicy = Field(
        default=RestartPolicy(), json_schema_extra=_object_default()
    )
    success_policy: SuccessPolicy = SuccessPolicy.CHIEF_SUCCEEDED
    """ChiefSucceeded: the job succeeds when worker 0 exits 0. AllWorkersSucceeded: when every
    worker has exited 0."""
    suspend: bool = False
    """Suspending deletes the workers and keeps the job; resuming starts a new group, which
    resumes from the last checkpoint."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Delete the job (and everything it owns) this long after it finished. Unset keeps it."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Which pods to delete when the job finishes: Running deletes those still running and
    keeps finished ones for their logs; All deletes every pod."""
    health: HealthSpec = Field(default=HealthSpec(), json_schema_extra=_object_default())

    @model_validator(mode="after")
    def _distinct_ports(self) -> MultiWorkerJobSpec:
        if self.health.progress_port == self.port:
            raise ValueError("health.progressPort must differ from port")
        return self


# --- status ---


class Condition(_Model):
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


class FailureRecord(_Model):
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


class ProgressStatus(_Model):
    """Training progress reported by the workers."""

    step: int | None = None
    """Latest training step of the chief."""


class JobStatus(BaseModel):
    """Observed state of the job, written only by the operator."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True
    )

    phase: Phase | None = None
    """Pending, Starting, Running, Restarting, Suspended, Succeeded or Failed."""
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
    """Ready workers of the current group out of spec.workers, e.g. 4/4."""
    ready_workers: int = 0
    """Workers of the current group that are running and ready."""
    total_workers: int = 0
    """spec.workers."""
    restarts: int = 0
    """Group restarts spent from spec.restartPolicy.maxRestarts."""
    disruptions: int = 0
    """Group restarts caused by disruptions (eviction, preemption, deletion, node loss); these
    do not spend the restart budget."""
    restart_after: Time | None = None
    """The next group is created no earlier than this (restart backoff)."""
    group_start_time: Time | None = None
    """When every pod of the current group had been created."""
    recovering_since: Time | None = None
    """When the failure that the current restart recovers from was observed."""
    last_recovery_seconds: float | None = None
    """Time from the last failure observed to the new group running."""
    last_failure: FailureRecord | None = None
    start_time: Time | None = None
    """When the first group was created."""
    completion_time: Time | None = None
    """When the job succeeded or failed."""
    progress: ProgressStatus | None = None


# --- the job as the operator sees it ---


class InvalidJobSpec(ValueError):
    """The job's spec breaks a rule the CRD could not enforce; `problems` name each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def spec_problems(error: ValidationError) -> list[str]:
    """Every validation error as `field.path: message`, in the CRD's camelCase."""
    problems = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{_field_path(item['loc'])}: {message}")
    return problems


@dataclass(frozen=True)
class Job:
    """A MultiWorkerJob: identity, parsed spec and last written status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: MultiWorkerJobSpec
    status: JobStatus
    created: datetime | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Job:
        """Parse a job as read from the API; raise InvalidJobSpec naming every bad field."""
        meta = body.get("metadata", {})
        name = meta.get("name", "")
        problems: list[str] = []
        spec: MultiWorkerJobSpec | None = None
        try:
            spec = MultiWorkerJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            problems.extend(spec_problems(e))
        if spec is not None:
            problems.extend(names.name_problems(name, spec.workers))
        if problems or spec is None:
            raise InvalidJobSpec(problems)
        created = meta.get("creationTimestamp")
        return cls(
            name=name,
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
            spec=spec,
            status=parse_status(body.get("status")),
            created=datetime.fromisoformat(created) if created else None,
        )


def parse_status(raw: Mapping[str, Any] | None) -> JobStatus:
    """The status as last written; one we cannot read (written by an older operator) is
    treated as empty rather than crashing the reconcile."""
    try:
        return JobStatus.model_validate(raw or {})
    except ValidationError:
        return JobStatus()
