"""Pure: one worker's state as its pod shows it (classify: a pod's API dict -> WorkerState).

The training container decides a worker's outcome (a sidecar may keep the pod Running after
training ended); pod-level signals decide whether a failure was a disruption — something
that is not the job's fault (eviction, preemption, deletion, node loss); the in-place agent's
and the warm launcher's records say where a pod restarted in place stands.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from multiworker.api import names
from multiworker.decide.tracebacks import readable

Pod = Mapping[str, Any]


class WorkerPhase(StrEnum):
    MISSING = "Missing"  # no pod
    PENDING = "Pending"  # not scheduled yet
    STARTING = "Starting"  # scheduled; containers not running yet
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # the job's fault: non-zero exit, pod failed
    DISRUPTED = "Disrupted"  # not the job's fault: evicted, preempted, deleted, node lost


# DisruptionTarget condition reasons (and pod reasons) → the reason we report.
_DISRUPTION_REASONS = {
    "PreemptionByScheduler": "Preempted",
    "EvictionByEvictionAPI": "Evicted",
    "DeletionByTaintManager": "NodeLost",
    "DeletionByPodGC": "NodeLost",
    "TerminationByKubelet": "Evicted",
    "Evicted": "Evicted",
    "Preempting": "Preempted",
    "NodeLost": "NodeLost",
    "Shutdown": "NodeShutdown",
    "NodeShutdown": "NodeShutdown",
    "Terminated": "NodeShutdown",
}


# Waiting reasons worth reporting while a worker starts (the others are routine).
PROBLEM_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})


# In-place restarts: the pod's containers have not all stopped yet for the new generation,
# and they have and its gate holds the rest of the pod until the operator releases it.
STOPPING_OLD_TRAINER = "StoppingOldTrainer"


WAITING_FOR_RELEASE = "WaitingForRelease"


# The trainer ended and the kubelet restarted the pod's containers before its exit was seen.
RESTARTED_IN_PLACE = "RestartedInPlace"


# The pod was evicted because it used more than it asked for: the job's fault, not a disruption.
EVICTED_FOR_USAGE = "EvictedForResourceUsage"


MESSAGE_LINES = 3


MESSAGE_CHARS = 600


FINAL_MESSAGE_CHARS = 4096  # what the kubelet keeps of a termination message


@dataclass(frozen=True)
class WorkerState:
    index: int
    phase: WorkerPhase
    pod: str = ""
    ready: bool = False
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    since: datetime | None = None  # failed/disrupted: when; pending/starting: pod creation
    started_at: datetime | None = None  # failed: when its trainer started, where known
    # Failed/disrupted: when this operator first saw it, on its own clock. `since` is the
    # node's (a kubelet's finishedAt) and only orders blame; windows and comparisons with
    # Lease arrivals use this, so a node whose clock is off cannot move them.
    seen_at: datetime | None = None
    uid: str = ""
    terminating: bool = False  # deletion requested
    ip: str = ""  # the pod's IP, where it serves GET /progress
    node: str = ""  # the node it was scheduled to
    # When the scheduler bound it (PodScheduled's transition): node trouble that began before
    # is older than the binding, so it is not this pod's (the node came back in between).
    scheduled_at: datetime | None = None
    image_id: str = ""  # the image its training container runs (a digest), once started
    # The pod itself has ended: phase Succeeded or Failed, or every container terminated (the
    # kubelet may report the last exit a moment before the phase). A trainer that exited while
    # a classic sidecar (a log shipper, istio-proxy) runs on leaves its pod Running, holding its
    # GPUs: cleanup goes by this, not by the trainer.
    pod_ended: bool = False
    progress_port: int | None = None  # where it serves GET /progress, as created
    # In-place restarts (pod/agent.py): the pod runs the agent with its restart rules
    # intact (an API server without the feature drops them), what it was rendered from, and
    # the trainer's restart count.
    agent: bool = False
    digest: str = ""
    trainer_restarts: int = 0
    exit_recorded: bool = False  # its failure of this generation is in its annotations
    released: int | None = None  # the generation the operator released in its pod (in place)
    # Refused by the scheduler: the nodes it was created to avoid (their Lease was silent).
    avoided_nodes: tuple[str, ...] = ()


def trainer_of(pod: Pod, fallback: str) -> str:
    """The pod's training container as the pod was created: recorded on it, else the rule
    (`tensorflow`, or the first container) applied to its own containers. Never the job's
    current template, which may have been edited since (a sidecar inserted first)."""
    meta = pod.get("metadata", {})
    recorded = (meta.get("annotations") or {}).get(names.ANNOTATION_TRAINER)
    if recorded:
        return str(recorded)
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if names.TRAINER_CONTAINER in containers:
        return names.TRAINER_CONTAINER
    return str(containers[0]) if containers and containers[0] else fallback


def classify(pod: Pod, index: int, container: str) -> WorkerState:
    """The state of one worker pod, judged by its training container (as the pod was created;
    `container` only for a pod that says nothing) and its pod status."""
    meta = pod.get("metadata", {})
    container = trainer_of(pod, container)
    state = _classify(pod, index, container)
    trainer = _container_status(pod.get("status", {}).get("containerStatuses", []), container)
    annotations = meta.get("annotations") or {}
    return replace(state, uid=meta.get("uid", ""), terminating="deletionTimestamp" in meta,
                   agent=_has_agent(pod), digest=annotations.get(names.ANNOTATION_POD_DIGEST, ""),
                   exit_recorded=_recorded_exit(pod) is not None,
                   released=int_or_none(annotations.get(names.ANNOTATION_RELEASED)),
                   trainer_restarts=int((trainer or {}).get("restartCount") or 0),
                   ip=pod.get("status", {}).get("podIP") or "",
                   node=(pod.get("spec") or {}).get("nodeName") or "",
                   scheduled_at=_scheduled_at(pod.get("status", {})),
                   image_id=(trainer or {}).get("imageID") or "",
                   pod_ended=_pod_ended(pod.get("status", {}), restartable=_has_agent(pod)),
                   progress_port=int_or_none((meta.get("annotations") or {})
                                      .get(names.ANNOTATION_PROGRESS_PORT)))


def _classify(pod: Pod, index: int, container: str) -> WorkerState:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    name = meta.get("name", "")
    trainer = _container_status(status.get("containerStatuses", []), container)
    terminated = (trainer.get("state") or {}).get("terminated") if trainer else None
    disruption = _disruption(meta, status)
    if disruption is None and _has_agent(pod):
        held = _in_place(pod, index, trainer)
        if held is not None:
            return held

    if terminated and terminated.get("exitCode") == 0:
        # Its message, kept whole: a final progress report (contract.FINAL_REPORT_PREFIX).
        return WorkerState(index, WorkerPhase.SUCCEEDED, name,
                           message=(terminated.get("message") or "")[:FINAL_MESSAGE_CHARS],
                           since=parse_time(terminated.get("finishedAt")))
    if terminated and not _happened_before(disruption, terminated):
        return _exited(index, name, terminated, "")
    if disruption is not None and disruption[0] == "Evicted" and _own_usage(disruption[1]):
        return WorkerState(index, WorkerPhase.FAILED, name, reason=EVICTED_FOR_USAGE,
                           message=disruption[1], since=disruption[2])
    if disruption is not None:
        return disruption_state(index, name, *disruption)
    if status.get("phase") == "Failed":
        return _pod_failed(index, name, status)
    if status.get("phase") == "Succeeded":
        return WorkerState(index, WorkerPhase.SUCCEEDED, name)
    if trainer and "running" in (trainer.get("state") or {}):
        return WorkerState(index, WorkerPhase.RUNNING, name, ready=_condition_true(status, "Ready"))
    return _starting(index, name, meta, status)


def disruption_state(
    index: int, pod: str, reason: str, message: str, since: datetime | None
) -> WorkerState:
    return WorkerState(index, WorkerPhase.DISRUPTED, pod, reason=reason, message=message,
                       since=since)


def tail(text: str, lines: int = MESSAGE_LINES, chars: int = MESSAGE_CHARS) -> str:
    """What a termination message says went wrong (tracebacks.readable): the exception and
    where, or the last lines; a NumPy array or a tensor in it elided."""
    return readable(text, lines, chars)


def _exited(index: int, pod: str, terminated: Mapping[str, Any], prefix: str) -> WorkerState:
    return WorkerState(
        index, WorkerPhase.FAILED, pod,
        exit_code=terminated.get("exitCode"),
        reason=terminated.get("reason") or "Error",
        message=prefix + tail(terminated.get("message") or ""),
        since=parse_time(terminated.get("finishedAt")),
        started_at=parse_time(terminated.get("startedAt")),
    )


def _pod_failed(index: int, pod: str, status: Mapping[str, Any]) -> WorkerState:
    """A failed pod whose training container never exited: an init container failed, or the
    kubelet rejected or stopped the pod."""
    for init in status.get("initContainerStatuses", []):
        terminated = (init.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return _exited(index, pod, terminated, f"init container {init.get('name')}: ")
    return WorkerState(index, WorkerPhase.FAILED, pod, reason=status.get("reason") or "Failed",
                       message=tail(status.get("message") or ""))


def _has_agent(pod: Pod) -> bool:
    """Whether the pod runs the in-place agent as rendered, its restart rule intact."""
    for init in (pod.get("spec") or {}).get("initContainers") or []:
        if init.get("name") == names.AGENT_CONTAINER:
            return bool(init.get("restartPolicyRules"))
    return False


def _in_place(pod: Pod, index: int, trainer: Mapping[str, Any] | None) -> WorkerState | None:
    """A pod with the agent, where its own state tells more than its trainer's: moved to a
    new generation that the operator has not released yet (starting), or held by its gate
    after this generation's trainer ended (failed: the kubelet restarted the pod's
    containers by the trainer's rule). None: judge it by its trainer as usual."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    name, annotations = meta.get("name", ""), meta.get("annotations") or {}
    generation = int_or_none((meta.get("labels") or {}).get(names.LABEL_GROUP_GENERATION))
    released = int_or_none(annotations.get(names.ANNOTATION_RELEASED))
    gate = _container_status(status.get("initContainerStatuses", []), names.GATE_CONTAINER)
    gate_running = gate is not None and "running" in (gate.get("state") or {})
    trainer_running = trainer is not None and "running" in (trainer.get("state") or {})
    since = max(filter(None, (parse_time(meta.get("creationTimestamp")),
                              parse_time(annotations.get(names.ANNOTATION_RESTARTED_AT)))),
                default=None)
    report = _launcher_report(annotations, generation)
    if generation is not None and released is not None and released < generation:
        if (gate_running and not trainer_running) or report.get("state") == "held":
            return WorkerState(index, WorkerPhase.STARTING, name, since=since,
                               reason=WAITING_FOR_RELEASE,
                               message=f"stopped; generation {generation} not released yet")
        return WorkerState(index, WorkerPhase.STARTING, name, since=since,
                           reason=STOPPING_OLD_TRAINER,
                           message=f"restarting in place for generation {generation}")
    ended = report.get("exit") if report.get("state") == "exited" else None
    if isinstance(ended, dict) and ended.get("exitCode") != 0:
        # The warm launcher's trainer failed; one that succeeded ends its container with 0.
        return _exited(index, name, ended, "")
    baseline = int_or_none(annotations.get(names.ANNOTATION_TRAINER_RESTARTS)) or 0
    restarts = int((trainer or {}).get("restartCount") or 0)
    if gate_running and not trainer_running and restarts > baseline:
        state = (trainer or {}).get("state") or {}
        ended = state.get("terminated") or ((trainer or {}).get("lastState") or {}).get(
            "terminated")
        if ended and ended.get("reason") != "RestartingAllContainers":
            return _exited(index, name, ended, "")
        recorded = _recorded_exit(pod)
        if recorded is not None:
            return _exited(index, name, recorded, "")
        return WorkerState(index, WorkerPhase.FAILED, name, reason=RESTARTED_IN_PLACE,
                           message="the trainer ended and the kubelet restarted the pod's "
                                   "containers before its exit code was seen",
                           since=parse_time((ended or {}).get("finishedAt")))
    return None


def _launcher_report(annotations: Mapping[str, Any], generation: int | None) -> Mapping[str, Any]:
    """The warm launcher's report on the pod (ANNOTATION_LAUNCHER, pod/launcher.py) if it
    is about the pod's generation; else empty."""
    try:
        found = json.loads(annotations.get(names.ANNOTATION_LAUNCHER) or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict) or generation is None or found.get("generation") != generation:
        return {}
    return found


def exit_record(generation: int, state: WorkerState) -> str:
    """What the operator writes on a pod whose trainer it saw exit (ANNOTATION_TRAINER_EXIT)."""
    return json.dumps({"generation": generation, "exitCode": state.exit_code,
                       "reason": state.reason, "message": state.message,
                       "startedAt": state.started_at.isoformat() if state.started_at else None,
                       "finishedAt": state.since.isoformat() if state.since else None},
                      separators=(",", ":"))


def _recorded_exit(pod: Pod) -> Mapping[str, Any] | None:
    """The trainer's exit recorded on the pod for the generation it is in, as a terminated
    state (ANNOTATION_TRAINER_EXIT); None if none is."""
    meta = pod.get("metadata", {})
    raw = (meta.get("annotations") or {}).get(names.ANNOTATION_TRAINER_EXIT)
    if not raw:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    generation = int_or_none((meta.get("labels") or {}).get(names.LABEL_GROUP_GENERATION))
    if not isinstance(found, dict) or found.get("generation") != generation:
        return None
    return found


def _starting(
    index: int, pod: str, meta: Mapping[str, Any], status: Mapping[str, Any]
) -> WorkerState:
    annotations = meta.get("annotations") or {}
    since = max(filter(None, (parse_time(meta.get("creationTimestamp")),
                              parse_time(annotations.get(names.ANNOTATION_RESTARTED_AT)))),
                default=None)
    scheduled = _condition(status, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        avoided = annotations.get(names.ANNOTATION_AVOIDED_NODES) or ""
        return WorkerState(index, WorkerPhase.PENDING, pod, since=since,
                           reason=scheduled.get("reason") or "Unschedulable",
                           message=scheduled.get("message") or "",
                           avoided_nodes=tuple(n for n in avoided.split(",") if n))
    if not status.get("hostIP") and scheduled is None:
        return WorkerState(index, WorkerPhase.PENDING, pod, since=since, reason="Pending")
    waiting = _waiting_reasons(status)
    problem = next((w for w in waiting if w[0] in PROBLEM_WAITING_REASONS), None)
    reason, message = problem or (waiting[0] if waiting else ("ContainerCreating", ""))
    return WorkerState(index, WorkerPhase.STARTING, pod, since=since, reason=reason,
                       message=message)


def _pod_ended(status: Mapping[str, Any], restartable: bool) -> bool:
    """`restartable`: the pod's failed containers restart its containers (the in-place
    agent's rules), so only a phase or exits that are all 0 end it."""
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and all(
        "terminated" in (c.get("state") or {})
        and not (restartable and c["state"]["terminated"].get("exitCode")) for c in containers)


def _waiting_reasons(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key, []):
            waiting = (container.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                found.append((waiting["reason"], tail(waiting.get("message") or "")))
    return found


def _disruption(
    meta: Mapping[str, Any], status: Mapping[str, Any]
) -> tuple[str, str, datetime | None] | None:
    """(reason, message, since) when the pod was disrupted rather than failing by itself."""
    target = _condition(status, "DisruptionTarget")
    if target is not None and target.get("status") == "True":
        reason = _DISRUPTION_REASONS.get(target.get("reason", ""), "Disrupted")
        # The kubelet's eviction message (which container used what) is in the pod status.
        message = status.get("message") or target.get("message") or ""
        return reason, message, parse_time(target.get("lastTransitionTime"))
    deletion = parse_time(meta.get("deletionTimestamp"))
    if deletion is not None:
        grace = timedelta(seconds=meta.get("deletionGracePeriodSeconds") or 0)
        return "Deleted", "the pod was deleted", deletion - grace
    if status.get("phase") == "Failed" and status.get("reason") in _DISRUPTION_REASONS:
        return _DISRUPTION_REASONS[status["reason"]], status.get("message") or "", None
    if status.get("phase") == "Unknown":
        return "NodeLost", "the pod's node stopped reporting", None
    return None


def _happened_before(
    disruption: tuple[str, str, datetime | None] | None, terminated: Mapping[str, Any]
) -> bool:
    """Whether the disruption came first (so the exit was its consequence). When either time
    is unknown the exit stands: a disruption must not excuse a failure it may not have caused."""
    if disruption is None:
        return False
    since, finished = disruption[2], parse_time(terminated.get("finishedAt"))
    return since is not None and finished is not None and since <= finished


def _own_usage(message: str) -> bool:
    """A kubelet eviction for the pod's own usage ("Container x was using 3Gi, which exceeds
    its request of 1Gi", "Pod ephemeral local storage usage exceeds the total limit"), as
    opposed to pressure others caused."""
    return "exceeds" in message or "exceeded" in message


def _container_status(statuses: list[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((s for s in statuses if s.get("name") == name), None)


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == type_), None)


def _scheduled_at(status: Mapping[str, Any]) -> datetime | None:
    scheduled = _condition(status, "PodScheduled")
    if scheduled is None or scheduled.get("status") != "True":
        return None
    return parse_time(scheduled.get("lastTransitionTime"))


def _condition_true(status: Mapping[str, Any], type_: str) -> bool:
    found = _condition(status, type_)
    return found is not None and found.get("status") == "True"


def int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
