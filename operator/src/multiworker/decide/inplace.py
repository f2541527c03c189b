"""Whether a group restart may reuse the group's pods (in place) or must recreate them.

In place, every pod keeps its node, IP, GPUs and volumes and the kubelet restarts its
containers (pod/agent.py); that is only right when every pod and node is healthy and the
pods are what the job would create now. Each answer that says no names why: it becomes the
restart's Event.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from multiworker.api.spec import MultiWorkerJobSpec, RestartMode
from multiworker.decide.fit import may_host
from multiworker.decide.nodes import NodeTrouble
from multiworker.decide.workers import WorkerPhase, WorkerState

# The kubelet that restarts all of a pod's containers on a rule (RestartAllContainers, beta
# and on by default since Kubernetes 1.36).
MIN_KUBELET = (1, 36)
# The old trainers must all have stopped this long after the in-place restart began: each
# stops within about 2 s here (2.1 s median warm, bench_in_place.py), a hung one when the
# launcher's SIGKILL follows its SIGTERM 5 s later; its report then reaches the operator
# through the agent and a pod write, which on a loaded CI node took more than the 5 s left of
# an earlier 10 s bound. A pod not holding yet is told again every RETELL_EVERY (a note lost:
# the kubelet's downwardAPI refresh once lagged over 30 s); past the bound the group is
# recreated, costing this much more than that.
STOP_BOUND = timedelta(seconds=15)
RETELL_EVERY = timedelta(seconds=3)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")

HEALTHY = (WorkerPhase.RUNNING, WorkerPhase.STARTING, WorkerPhase.FAILED)
# What a node declares (status.declaredFeatures, NodeDeclaredFeatures) when its kubelet can
# restart all of a pod's containers: the scheduler places a pod with that rule nowhere else.
RESTART_FEATURE = "RestartAllContainersOnContainerExits"


def agent_blocker(pod_spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the job's pods must not carry the in-place agent; None: they may. A pod with its
    restart rule can only be scheduled to nodes that declare RESTART_FEATURE, so it gets the
    rule only when every node it could otherwise land on (its nodeSelector matches — the GPU
    product's too, so ask about the pod as rendered —, its tolerations cover the taints, not
    cordoned, it has the GPUs the pod asks for) declares it, and there is one."""
    candidates = [n for n in nodes if may_host(n, pod_spec)]
    if not candidates:
        return "no schedulable node for the pods is known"
    lacking = sorted(str((n.get("metadata") or {}).get("name", "")) for n in candidates
                     if RESTART_FEATURE not in ((n.get("status") or {})
                                                .get("declaredFeatures") or []))
    if lacking:
        shown = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3
                                          else "")
        return f"nodes {shown} do not declare {RESTART_FEATURE}"
    return None


def in_place_blocker(
    spec: MultiWorkerJobSpec, workers: tuple[WorkerState, ...], digest: str, *,
    troubles: Mapping[str, NodeTrouble], kubelets: Mapping[str, str], gang: bool,
) -> str | None:
    """Why this group must be recreated rather than restarted in place; None: in place.
    `digest` is what the job's pods are rendered from now (render.pod_digest), `kubelets`
    the kubelet version of each node."""
    if spec.restart_policy.mode is RestartMode.RECREATE:
        return "spec.restartPolicy.mode is Recreate"
    if gang:
        return "gang scheduling places each generation as a new PodGroup"
    return next(filter(None, (_pod_blocker(w, digest) or _node_blocker(w, troubles, kubelets)
                              for w in workers)), None)


def _pod_blocker(w: WorkerState, digest: str) -> str | None:
    who = f"worker-{w.index}"
    if w.phase is WorkerPhase.MISSING:
        return f"{who} has no pod"
    if w.terminating:
        return f"{who}'s pod is being deleted"
    if w.phase is WorkerPhase.DISRUPTED:
        return f"{who}'s pod was disrupted ({w.reason})"
    if w.phase not in HEALTHY or w.pod_ended or not w.node:
        return f"{who}'s pod is {'ended' if w.pod_ended else w.phase.value.lower()}"
    if not w.agent:
        return (f"{who}'s pod has no in-place agent (mode Recreate when it was created, a "
                f"node it could land on not declaring {RESTART_FEATURE}, or an API server "
                "without the ContainerRestartRules feature)")
    if w.digest != digest:
        return f"{who}'s pod was created from an earlier template or image"
    return None


def _node_blocker(w: WorkerState, troubles: Mapping[str, NodeTrouble],
                  kubelets: Mapping[str, str]) -> str | None:
    trouble = troubles.get(w.node)
    if trouble is not None:
        return f"worker-{w.index}'s {trouble.describe()}"
    version = kubelets.get(w.node, "")
    if not _at_least(version, MIN_KUBELET):
        return (f"the kubelet of node {w.node} is {version or 'of unknown version'}, "
                f"older than v{MIN_KUBELET[0]}.{MIN_KUBELET[1]}")
    return None


def stop_deadline(since: datetime) -> datetime:
    return since + STOP_BOUND


def retell_at(since: datetime, now: datetime) -> datetime:
    """When the pods not holding yet are next told of the rise again: every RETELL_EVERY
    after it began (the first note goes with the relabel)."""
    return since + RETELL_EVERY * ((now - since) // RETELL_EVERY + 1)


def _at_least(version: str, minimum: tuple[int, int]) -> bool:
    found = _VERSION.match(version)
    return found is not None and (int(found[1]), int(found[2])) >= minimum
