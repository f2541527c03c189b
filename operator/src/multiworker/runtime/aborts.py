"""Turning TensorFlow's multi-line collective errors into one line an operator can act on."""

from __future__ import annotations

import re

from multiworker.runtime.config import RuntimeConfig

_TELLING = ("aborted by", "timed out", "unhealthy", "connection", "socket closed", "failed")
_TASK = re.compile(r"/job:worker/(?:replica:\d+/)?task:(\d+)")
# TF prefixes the cause with the failing op's name and repeats "aborted by" per hop.
_PREFIX = re.compile(r"^(\{\{[^}]*\}\}\s*)?(Collective ops is aborted by:\s*)*")


def describe_abort(kind: str, message: str, config: RuntimeConfig) -> str:
    """Names the error kind, its most telling line, and the peers that line mentions."""
    lines = [_PREFIX.sub("", line.strip()) for line in message.splitlines()]
    summary = _summary([line for line in lines if line])
    suspects = named_peers(summary, config)
    return (
        f"collective aborted ({kind}): {summary[:300]}"
        + (f"; suspect peers: {', '.join(suspects)}" if suspects else "")
        + "; a peer died or stopped answering, the group must restart"
    )


def named_peers(text: str, config: RuntimeConfig) -> list[str]:
    """The other workers TF names in `text` ("/job:worker/replica:0/task:1"), with addresses."""
    tasks = {int(t) for t in _TASK.findall(text)} - {config.worker_index}
    return [f"worker {t} ({config.peers[t]})" for t in sorted(tasks) if t < len(config.peers)]


def _summary(lines: list[str]) -> str:
    """The first telling line, joined with the next when it ends in a colon (a task list)."""
    for i, line in enumerate(lines):
        if any(k in line.lower() for k in _TELLING):
            return " ".join(lines[i : i + 2]) if line.endswith(":") else line
    return lines[0] if lines else ""
