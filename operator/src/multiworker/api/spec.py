"""The MultiWorkerJob spec as pydantic models: the single source of the CRD schema (crd.py).

Field docstrings become the CRD's descriptions (`kubectl explain`); `cel(...)` rules become
`x-kubernetes-validations`, and each has a pydantic twin so the operator reports the same
problem with the same words when the CRD did not catch it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from multiworker.api import contract
from multiworker.api.schema import Model, cel, validations
from multiworker.api.template import PodTemplate

# Durations in seconds stop at the int32 most Kubernetes APIs use (about 68 years): the
# operator adds them to datetimes, which overflow long before int64 does.
MAX_SECONDS = 2**31 - 1


class ExitCodeAction(StrEnum):
    FAIL_JOB = "FailJob"
    RESTART_GROUP = "RestartGroup"


class RestartMode(StrEnum):
    IN_PLACE = "InPlace"
    RECREATE = "Recreate"


class SuccessPolicy(StrEnum):
    CHIEF_SUCCEEDED = "ChiefSucceeded"
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"


class CleanPodPolicy(StrEnum):
    RUNNING = "Running"
    ALL = "All"


class ImageSkewPolicy(StrEnum):
    PIN_TO_CHIEF = "PinToChief"
    FAIL_JOB = "FailJob"


class ElasticBatch(StrEnum):
    KEEP_GLOBAL = "KeepGlobal"
    SCALE_LEARNING_RATE = "ScaleLearningRate"


# A relative path inside the claim: no segment may start with "." (so no ".." out of it);
# "." alone is the claim's root, where checkpoints were written before per-job directories.
_PATH_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]*"
_CLAIM_SUBPATH = rf"^(\.|{_PATH_SEGMENT}(/{_PATH_SEGMENT})*)$"


class CheckpointSpec(Model):
    """A shared volume every worker mounts. Each job checkpoints in its own directory on it,
    `<mountPath>/<namespace>/<name>-<uid>` (MWJ_CHECKPOINT_DIR), and every new group of the job
    restores from there; so jobs sharing a claim, or a job deleted and applied again under the
    same name, never restore each other's checkpoints unless resumeFrom says so."""

    claim_name: str = Field(min_length=1, max_length=253)
    """Name of an existing PersistentVolumeClaim in the job's namespace (ReadWriteMany when
    workers run on several nodes)."""
    mount_path: str = Field(default="/checkpoints", pattern="^/")
    """Absolute path where the claim is mounted in the training container."""
    resume_from: str | None = Field(default=None, max_length=1024, pattern=_CLAIM_SUBPATH)
    """Continue on purpose from another run's checkpoints: their directory on the claim,
    relative to mountPath, e.g. `default/digits-cpu-6f0c...` (the earlier job's
    MWJ_CHECKPOINT_DIR without the mountPath; its workers log it at start). While this job has
    no checkpoint of its own, a new group restores the latest checkpoint found there, although
    another job wrote it; it still saves to its own directory, so the other run's files are
    never changed; `.` is the claim's root (where jobs of earlier operator versions saved).
    Unset: a new job starts from step 0, and the workers refuse (exit 2) a checkpoint written
    by a different job."""


class ExitCodeRule(Model):
    """What to do when the training container exits with one of `values`."""

    action: ExitCodeAction
    """FailJob fails the job at once; RestartGroup restarts the whole group and spends one
    restart of spec.restartPolicy.maxRestarts."""
    values: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        min_length=1, max_length=255, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Exit codes (1-255) this rule matches."""


_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"  # a dotted module name


class RestartPolicy(Model):
    """When and how fast a failed group is restarted. A failure of any worker restarts the
    whole group; disruptions that are not the job's fault (pod evicted, preempted or deleted,
    node lost) restart it without spending a restart."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                # has(): the API server also checks the bare default {} against this rule.
                "!has(self.maxBackoffSeconds) || !has(self.backoffSeconds) || "
                "self.maxBackoffSeconds >= self.backoffSeconds",
                "spec.restartPolicy.maxBackoffSeconds must be at least backoffSeconds",
                ".maxBackoffSeconds",
            )
        )
    )

    max_restarts: int = Field(default=3, ge=0, le=10000)
    """How many times a failed group is restarted before the job fails."""
    max_disruptions: int = Field(default=20, ge=0, le=10000)
    """How many disruptions (pod evicted, preempted or deleted, node lost) restart the group
    without spending maxRestarts before the job fails. The first restarts at once, later ones
    back off like restarts (backoffSeconds doubling, at least 1s)."""
    backoff_seconds: int = Field(default=1, ge=0, le=86400)
    """Wait before the first restart; doubles with every restart spent (1, 2, 4, ... by
    default: a transient failure recovers at once, a crash loop slows down)."""
    max_backoff_seconds: int = Field(default=300, ge=0, le=86400)
    """Upper bound of the exponential backoff."""
    on_exit_codes: list[ExitCodeRule] = Field(default_factory=list, max_length=32)
    """Rules by exit code of the training container, first match wins."""
    default_action: ExitCodeAction = ExitCodeAction.RESTART_GROUP
    """Action for a non-zero exit code no rule matches."""
    mode: RestartMode = RestartMode.RECREATE
    """Recreate deletes the group's pods and creates new ones. InPlace (opt-in) restarts the
    group in its own pods when every pod and node is healthy (a trainer failed or hung): the
    kubelet restarts each pod's containers (RestartAllContainers, Kubernetes 1.36), keeping its
    node, IP, GPUs and volumes, and no trainer of the new group starts before every trainer of
    the old one stopped; otherwise it recreates them, saying why. Takes effect for pods created
    after it is set."""
    fail_fast_on_repeated_startup_error: bool = True
    """Fail the job, without spending the restarts left, when a group dies before training a
    step of the same error as the group before it (same exit code, exception and message but
    for numbers): a script that fails this way every time — an import error, a missing
    file, a shape mismatch — fails the job after its second try, with reason
    RepeatedStartupError and the error's own words. Before a step means: no worker reported
    a step past its restored one on GET /progress, or, for a script that serves none, the
    failing container ran under 5 minutes. Errors from peers (UnavailableError, ...) never
    count."""
    survivor_save_seconds: int = Field(default=300, ge=0, le=3600)
    """The most the pods of a group broken by a worker's failure or a lost node may take to
    stop, when its workers run the multiworker runtime with checkpoints: its survivors write
    one copy of the model's state between them on the way out and exit as soon as it is
    complete. They get twice the time the chief measured writing the state once takes
    (status.progress.expectedSaveSeconds) and 5 s, at least 10 s, at most this: 0.1 s for the
    test model; a 1-billion-parameter model with Adam (12 GB) over a 200 MB/s volume, 60 s.
    Other jobs' broken groups get 3 s."""
    warm_standby: bool = True
    """InPlace only: each pod keeps a spare Python interpreter that has already imported
    warmModules, and the next generation's trainer runs in it (the training container's command
    then runs under a launcher): an in-place restart skips TensorFlow's import. Taken where
    the training container's command runs a Python script, module or -c code; otherwise, or
    when false, the kubelet restarts the trainer cold (an Event WarmStandbyOff says why).
    Takes effect for pods created after it is set."""
    warm_modules: list[Annotated[str, Field(min_length=1, max_length=253, pattern=_MODULE)]] = \
        Field(default=["tensorflow"], max_length=16)  # copied per model: pydantic's rule
    """InPlace only: what the spare interpreter imports before it is needed (it must not touch
    a GPU on import: TensorFlow does not)."""
    agent_port: int = Field(default=contract.DEFAULT_AGENT_PORT, ge=1, le=65535)
    """InPlace only: the port where each pod's restart agent hears of a new generation from
    the operator at once (the pod's labels reach it too, later: the kubelet refreshes them on
    its own schedule). In mode InPlace it must differ from port and health.progressPort."""

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


class HealthSpec(Model):
    """Detection of workers that cannot start, hang or straggle."""

    progress_timeout_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    """Restart the group (spending a restart) when no worker advances for this long: hang
    detection. Measured once every worker runs; a worker advances when GET /progress reports a
    new step or a new phase (starting, waiting-for-peers, training), and one that does not
    answer does not advance (workers must serve /progress, as multiworker.runtime does).
    Unset or null turns it off."""
    progress_port: int = Field(default=contract.DEFAULT_PROGRESS_PORT, ge=1, le=65535)
    """Port where workers serve GET /progress (MWJ_PROGRESS_PORT)."""
    startup_timeout_seconds: int | None = Field(default=300, ge=1, le=MAX_SECONDS)
    """Fail the job when a worker cannot start for this long (unschedulable, image pull
    errors, bad container config); null waits forever."""
    straggler_threshold: float | None = Field(default=None, gt=0, le=1)
    """Report a worker as a straggler when its steps per second fall below this fraction of
    the group's median. Unset turns it off."""
    node_lost_seconds: int = Field(default=20, ge=1, le=3600)
    """Restart the group (as a disruption) when a worker's node has been NotReady or
    unreachable for this long, or its kubelet has not renewed the node's Lease for this long
    (renewed every 10 s: 20 s is two renewals missed) while the worker does not answer
    /progress — Kubernetes itself calls the node NotReady after 50 s and evicts its pods only
    after ~5 minutes."""
    peer_timeout_seconds: int = Field(default=contract.DEFAULT_PEER_TIMEOUT_SECONDS, ge=1,
                                      le=MAX_SECONDS)
    """How long a starting worker waits for its peers (MWJ_PEER_TIMEOUT_SECONDS)."""
    collective_timeout_seconds: int = Field(
        default=contract.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, ge=1, le=MAX_SECONDS)
    """Abort a collective whose peer is gone after this long (MWJ_COLLECTIVE_TIMEOUT_SECONDS)."""


DEFAULT_GANG_SCHEDULER = "scheduler-plugins-scheduler"


class GangSpec(Model):
    """Gang scheduling: place all workers of a group at once or none of them, so a group that
    does not fit holds no GPUs while it waits, and two jobs that each fit alone cannot hold
    each other's GPUs. Needs the scheduler-plugins coscheduling scheduler and its PodGroup CRD
    (scheduling.x-k8s.io/v1alpha1); without the CRD the job says so in a condition and creates
    no workers."""

    enabled: bool | None = None
    """true: every group gets a PodGroup with minMember = workers, and its pods carry the
    PodGroup label and schedulerName. false: the scheduler places workers one by one. Unset:
    the operator's default (--default-gang-scheduling; the chart's gangScheduling.default)."""
    scheduler_name: str = Field(default=DEFAULT_GANG_SCHEDULER, min_length=1, max_length=253,
                                pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """The scheduler whose profile enables the Coscheduling plugin; gang-scheduled workers get
    it as spec.schedulerName (scheduler-plugins' own install names it
    scheduler-plugins-scheduler)."""
    schedule_timeout_seconds: int = Field(default=60, ge=1, le=86400)
    """How long the scheduler keeps the places of the workers that fit while it looks for room
    for the rest (the PodGroup's scheduleTimeoutSeconds); then it releases all of them and
    tries the whole group again later."""


class ElasticSpec(Model):
    """A group that may train with fewer workers than `workers` when not all of them can be
    placed (a lost node, GPUs taken meanwhile, a flavor full), and grows back when room
    returns. Each change of size is a new generation from the coordinated checkpoint; it
    spends neither the restart nor the disruption budget."""

    min_workers: int = Field(ge=1, le=1024)
    """The fewest workers the group trains with (at most `workers`)."""
    shrink_after_seconds: int = Field(default=60, ge=1, le=MAX_SECONDS)
    """How long some workers of a group may stay unplaced before the next generation starts
    with those that are placed (at least minWorkers)."""
    grow_after_seconds: int = Field(default=120, ge=1, le=MAX_SECONDS)
    """How long room for more workers must last, also since the last resize, before a shrunk
    group grows back: room that comes and goes moves nothing."""
    batch: ElasticBatch = ElasticBatch.KEEP_GLOBAL
    """KeepGlobal: each step's global batch stays the same, split over fewer workers (the
    maths of a step unchanged where the global batch divides evenly). ScaleLearningRate: each
    worker's batch stays the same and the learning rate follows the size (the linear scaling
    rule: × workers / spec.workers)."""


def _object_default() -> dict[str, Any]:
    """Let the API server default a nested object so its own defaults show in the stored job."""
    return {"default": {}}


class MultiWorkerJobSpec(Model):
    """A TensorFlow MultiWorkerMirroredStrategy job: `workers` identical pods that train as
    one group and are restarted together."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.health) || !has(self.health.progressPort) || !has(self.port) || "
                "self.health.progressPort != self.port",
                "spec.health.progressPort must differ from spec.port",
                ".health.progressPort",
            ),
            cel(
                "!has(self.restartPolicy) || !has(self.restartPolicy.agentPort) || "
                "!has(self.restartPolicy.mode) || self.restartPolicy.mode != 'InPlace' || "
                "self.restartPolicy.agentPort != (has(self.port) ? self.port : 2222) && "
                "self.restartPolicy.agentPort != (has(self.health) && "
                "has(self.health.progressPort) ? self.health.progressPort : "
                f"{contract.DEFAULT_PROGRESS_PORT})",
                "spec.restartPolicy.agentPort must differ from spec.port and "
                "spec.health.progressPort in mode InPlace",
                ".restartPolicy.agentPort",
            ),
            cel(
                "!has(self.elastic) || self.elastic.minWorkers <= self.workers",
                "spec.elastic.minWorkers must not exceed spec.workers",
                ".elastic.minWorkers",
            ),
            cel(
                "(has(self.suspend) && self.suspend) || (has(oldSelf.suspend) && oldSelf.suspend)"
                " || self.workers == oldSelf.workers",
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
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """Delete the job (and everything it owns) this long after it finished. Unset keeps it."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Which pods to delete when the job finishes: Running deletes those still running and
    keeps finished ones for their logs; All deletes every pod."""
    health: HealthSpec = Field(default=HealthSpec(), json_schema_extra=_object_default())
    image_skew_policy: ImageSkewPolicy = ImageSkewPolicy.PIN_TO_CHIEF
    """When the workers of one group run different image digests (a tag that resolved
    differently on different nodes): PinToChief restarts the group with every worker on the
    chief's digest (once; a disruption, not a restart); FailJob fails the job."""
    gpu_product: str | None = Field(default=None, min_length=1, max_length=63)
    """Place every worker on nodes labelled nvidia.com/gpu.product=<this> (NVIDIA GPU feature
    discovery sets it). Unset: where nodes carry that label, the operator picks, for each new
    group, one product whose nodes can hold the whole group (status.gpuProduct), and says so
    when none can — workers of one group never mix GPU models."""
    gang: GangSpec = Field(default=GangSpec(), json_schema_extra=_object_default())
    elastic: ElasticSpec | None = None
    """Unset: the group always has `workers` workers, and waits until all can be placed."""

    @model_validator(mode="after")
    def _elastic_within_workers(self) -> MultiWorkerJobSpec:
        if self.elastic is not None and self.elastic.min_workers > self.workers:
            raise ValueError("elastic.minWorkers must not exceed workers")
        return self

    @model_validator(mode="after")
    def _distinct_ports(self) -> MultiWorkerJobSpec:
        if self.health.progress_port == self.port:
            raise ValueError("health.progressPort must differ from port")
        if (self.restart_policy.mode is RestartMode.IN_PLACE
                and self.restart_policy.agent_port in (self.port, self.health.progress_port)):
            raise ValueError("restartPolicy.agentPort must differ from port and "
                             "health.progressPort in mode InPlace")
        return self
