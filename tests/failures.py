"""What a failed cluster test shows in its own report, so a reader finds the cause without
rerunning it: each job's status (phase, conditions, last failure, progress), the namespace's
latest Events, each pod's state, and the tail of the test's operator log. tests/conftest.py
adds it to every failed test that has a `namespace` (before its teardown deletes it); the whole
namespace is saved to test-logs/ as well."""

from __future__ import annotations

import json
import subprocess
from typing import Any, Protocol

from tests.cluster import Cluster

EVENTS = 15
OPERATOR_LINES = 60


class HasLogTail(Protocol):
    def log_tail(self, lines: int = 60) -> str: ...


def explain(cluster: Cluster, namespace: str, operator: HasLogTail | None = None) -> str:
    """The namespace's story in a few dozen lines; what cannot be read says why."""
    parts = [f"namespace {namespace}"]
    parts += _section("jobs", lambda: [_job(j) for j in _items(cluster, namespace, "multiworkerjobs")])
    parts += _section("pods", lambda: [_pod(p) for p in _items(cluster, namespace, "pods")])
    parts += _section(f"last {EVENTS} events", lambda: _events(cluster, namespace))
    if operator is not None:
        parts += _section(f"operator log, last {OPERATOR_LINES} lines",
                          lambda: operator.log_tail(OPERATOR_LINES).splitlines())
    return "\n".join(parts)


def _section(title: str, lines: Any) -> list[str]:
    try:
        found = lines()
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:  # a cluster that
        # is down is part of the story, not a new failure
        found = [f"(cannot read: {type(e).__name__}: {str(e)[:300]})"]
    return [f"-- {title}", *(found or ["(none)"])]


def _items(cluster: Cluster, namespace: str, kind: str) -> list[dict[str, Any]]:
    proc = cluster.kubectl("-n", namespace, "get", kind, "-o", "json", timeout=20)
    items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
    return items


def _job(job: dict[str, Any]) -> str:
    s = job.get("status") or {}
    conditions = "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: "
                           f"{c.get('message', '')[:160]}" for c in s.get("conditions") or [])
    failure = s.get("lastFailure")
    lines = [(f"{job['metadata']['name']}: phase {s.get('phase')}, generation "
              f"{s.get('groupGeneration', 0)}, ready {s.get('ready')}, restarts "
              f"{s.get('restarts', 0)}, disruptions {s.get('disruptions', 0)}"),
             f"  conditions: {conditions or '(none)'}"]
    if failure:
        lines.append(f"  lastFailure: {json.dumps(failure)[:400]}")
    if s.get("progress"):
        lines.append(f"  progress: {json.dumps(s['progress'])[:300]}")
    return "\n".join(lines)


def _pod(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    containers = []
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = next(iter(c.get("state") or {"unknown": {}}))
        detail = (c.get("state") or {}).get(state) or {}
        why = detail.get("reason") or ""
        code = f" exit {detail['exitCode']}" if "exitCode" in detail else ""
        containers.append(f"{c['name']}={state}{code} {why} restarts {c.get('restartCount', 0)}")
    labels = pod["metadata"].get("labels") or {}
    return (f"{pod['metadata']['name']} gen {labels.get('multiworker.dev/group-generation', '-')}"
            f" {status.get('phase')} on {pod.get('spec', {}).get('nodeName') or '(unscheduled)'}"
            f"{' terminating' if pod['metadata'].get('deletionTimestamp') else ''}: "
            + ", ".join(containers))


def _events(cluster: Cluster, namespace: str) -> list[str]:
    events = _items(cluster, namespace, "events")
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('type')} {e.get('reason')} "
            f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: "
            f"{(e.get('message') or '')[:200]}" for e in events[-EVENTS:]]
