"""The state of one reconcile pass (Pass), what it returns (Outcome), and what a pass needs
from the cluster (ClusterIO: reads from the watch-fed caches, writes to the API server)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from multiworker.api.conditions import Status, Type, set_condition
from multiworker.api.job import Job
from multiworker.api.status import JobStatus
from multiworker.clients.agents import AgentNote
from multiworker.clients.writes import Created, GenerationDeletion, PodDeletion, PodPatch, Refused
from multiworker.decide.nodes import NodeTrouble
from multiworker.decide.observe import ObservedGroup
from multiworker.decide.progress import GroupHealth, Targets
from multiworker.decide.queueing import FlavorFields
from multiworker.logs import JobLogger
from multiworker.reconcile.events import event_type

Manifest = dict[str, Any]


class ClusterIO(Protocol):
    """Reads come from memory (informer.py); writes go to the API server (k8s.py). The
    controller joins the two; unit tests use an in-memory fake."""

    def cached_job(self, namespace: str, name: str) -> Manifest | None: ...
    def cached_pods(self, namespace: str, job: str) -> list[Manifest]: ...
    def cached_node(self, name: str) -> Manifest | None: ...
    def cached_nodes(self) -> list[Manifest]: ...
    def get_node(self, name: str) -> Manifest | None: ...
    def heartbeat_silence(self, node: str) -> float | None: ...
    def reread_lease(self, node: str) -> None: ...
    def silent_nodes(self) -> set[str]: ...
    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> str: ...
    def delete_job(self, namespace: str, name: str, uid: str) -> None: ...
    def get_pod(self, namespace: str, name: str) -> Manifest | None: ...
    def get_service(self, namespace: str, name: str) -> Manifest | None: ...
    def create_pods(self, pods: Sequence[Manifest]) -> list[Created | Refused]: ...
    def create_service(self, service: Manifest) -> Created: ...
    def delete_pods(self, deletions: Sequence[PodDeletion]) -> None: ...
    def delete_generation(self, deletion: GenerationDeletion) -> None: ...
    def patch_pods(self, patches: Sequence[PodPatch]) -> list[bool]: ...
    def cached_all_pods(self) -> list[Manifest]: ...
    def pods_on_node(self, node: str) -> list[Manifest] | None: ...
    def api_served(self, group_version: str, plural: str) -> bool: ...
    def create_object(self, path: str, manifest: Manifest) -> Created: ...
    def get_object(self, path: str) -> Manifest | None: ...
    def delete_object(self, path: str) -> None: ...
    def cached_workloads(self, namespace: str, job: str) -> list[Manifest] | None: ...
    def replace_status(self, path: str, obj: Manifest, status: Manifest) -> Manifest: ...
    def drop_finalizer(self, path: str, obj: Manifest, finalizer: str) -> None: ...
    def patch_object(self, path: str, patch: Manifest) -> None: ...
    def emit_event(
        self, job: Manifest, type_: str, reason: str, message: str, now: datetime
    ) -> None: ...


class Flow(Enum):
    CONTINUE = "continue"
    DONE = "done"  # skip the remaining steps; the status is still written


@dataclass(frozen=True)
class Outcome:
    requeue: float | None = None  # run again within this many seconds
    gone: bool = False  # the job is gone or being deleted: stop looking after it
    targets: Targets | None = None  # workers to poll for progress until the next pass
    # Our own status write: the version we read, and the job as it is after the write.
    written: tuple[str, Manifest] | None = None
    created: tuple[str, ...] = ()  # pods created by this pass (the cache may not show them)
    agent_notes: tuple[AgentNote, ...] = ()  # to send once the pass is done (agents.py)


@dataclass(frozen=True)
class Options:
    """The operator's command-line choices that passes need."""

    gang_default: bool = False  # --default-gang-scheduling
    # --worker-network-policy: every job gets a NetworkPolicy that admits its own workers and,
    # on the progress port, the operator's pods in this namespace. None: no policy.
    policy_operator_namespace: str | None = None
    kueue: bool = False  # --kueue: jobs naming a Kueue queue wait for its admission


@dataclass
class Pass:
    """Everything one pass knows and decides; steps read it and record their decisions."""

    cluster: ClusterIO
    body: Manifest
    job: Job
    group: ObservedGroup
    troubles: Mapping[str, NodeTrouble]  # nodes of this job's pods that are in trouble
    now: datetime
    status: JobStatus  # the new status, written once at the end (commit.py)
    log: JobLogger
    health: GroupHealth | None = None  # the workers' progress, as last polled
    pods: list[Manifest] = field(default_factory=list)  # the job's pods, as cached
    last_write: datetime | None = None  # when this operator last wrote the job's status
    options: Options = field(default_factory=lambda: Options())
    events: list[tuple[str, str, str]] = field(default_factory=list)
    after_write: list[Callable[[], None]] = field(default_factory=list)
    requeue: float | None = None
    blocked: tuple[str, str] | None = None  # why the group cannot be created (condition)
    deleted: bool = False  # the job was deleted (ttlSecondsAfterFinished)
    created: list[str] = field(default_factory=list)  # pods this pass created
    outdated: bool = False  # the status moved on since this pass read it: write nothing
    agent_notes: list[AgentNote] = field(default_factory=list)
    flavor_fields: FlavorFields | None = None  # what Kueue's admitted flavors ask of pods

    def wake_in(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def wake_at(self, moment: datetime | None) -> None:
        if moment is not None:
            self.wake_in((moment - self.now).total_seconds())

    def emit(self, reason: str, message: str) -> None:
        """An Event, emitted after the status write succeeded; its type follows events.py."""
        self.events.append((event_type(reason), reason, message))

    def condition(self, type_: Type, status: Status, reason: str, message: str) -> None:
        self.status.conditions = set_condition(
            self.status.conditions, type_, status, reason, message, self.now
        )
