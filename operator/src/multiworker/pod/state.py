"""The pod's generation as its restart agents know it (agent.py), kept in files: the
downwardAPI's copy of the pod's label and annotation (POD_INFO, refreshed by the kubelet on its
own schedule), what the operator told the agent (STATE: told-generation, told-released), the
generation the gate last opened, and the warm launcher's report. Every value only rises, and
the higher of the label and the operator's word wins. Stdlib only; shipped beside agent.py.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

POD_INFO = os.environ.get("MWJ_AGENT_POD_INFO", "/etc/multiworker")
STATE = os.environ.get("MWJ_AGENT_STATE", "/run/multiworker")
POLL_SECONDS = 0.05
# What the warm launcher (launcher.py) last reported, in STATE.
LAUNCHER_REPORT = "launcher.json"


def read_number(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def higher(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def generation() -> int | None:
    return higher(read_number(os.path.join(POD_INFO, "generation")),
                   read_number(os.path.join(STATE, "told-generation")))


def released() -> int | None:
    return higher(read_number(os.path.join(POD_INFO, "released")),
                   read_number(os.path.join(STATE, "told-released")))


def keep(name: str, value: object) -> None:
    """Keep a told value if it is higher than the one kept (tmp + rename: the gate never
    reads half a number)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return
    path = os.path.join(STATE, name)
    kept = read_number(path)
    if kept is not None and kept >= value:
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # the gate writes here too
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, path)


def launcher_report() -> dict[str, Any] | None:
    """What the warm launcher last wrote (launcher.py), None where it runs not."""
    try:
        with open(os.path.join(STATE, LAUNCHER_REPORT)) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def publish(value: int | None) -> None:
    """The pod's generation as the agent knows it, for the trainer (MWJ_POD_GENERATION_FILE):
    an old trainer stopped because its pod moved on then exits at once, even before the
    kubelet refreshes the label's file."""
    if value is not None:
        keep("pod-generation", value)


def opened() -> int | None:
    """The last generation the gate let start in this pod (kept across container restarts)."""
    return read_number(os.path.join(STATE, "opened"))
