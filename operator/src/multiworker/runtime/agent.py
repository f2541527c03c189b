"""The in-place restart agent of a worker pod (docs/contracts.md, "How a group restarts").

Runs with python3 from the trainer's own image (the operator ships this file in the job's
ConfigMap), stdlib only, in two init containers of every worker pod:

- ``watch`` (a native sidecar): exits RESTART_EXIT as soon as the pod's group-generation
  label rises above the generation whose trainer the gate let start. The sidecar's restart
  rule turns that exit into the kubelet's RestartAllContainers: every container of the pod
  is killed and the init containers run again, in the same pod, on the same node, with the
  same IP and devices.
- ``gate`` (a one-shot init container, after the sidecar): lets the rest of the pod start
  only once the operator has released the pod's generation (its released-generation
  annotation), and only once per generation. The operator releases a generation when every
  worker of the group is held here, so no trainer of the new generation starts while one of
  the old still runs; a trainer that fails is restarted by its own rule and held here until
  the operator decides.

Both read the labels and annotations through a downwardAPI volume, so the pod needs no API
credentials.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POD_INFO = os.environ.get("MWJ_AGENT_POD_INFO", "/etc/multiworker")
STATE = os.environ.get("MWJ_AGENT_STATE", "/run/multiworker")
RESTART_EXIT = 86
POLL_SECONDS = 0.05


def _read(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def generation() -> int | None:
    return _read(os.path.join(POD_INFO, "generation"))


def released() -> int | None:
    return _read(os.path.join(POD_INFO, "released"))


def opened() -> int | None:
    """The last generation the gate let start in this pod (kept across container restarts)."""
    return _read(os.path.join(STATE, "opened"))


def watch() -> int:
    """Exit RESTART_EXIT once a trainer may run of a generation older than the pod's.

    No trainer runs when this sidecar starts (the kubelet starts it first, and a restart of
    all containers stops the others first), so only a generation the gate opens during its
    life can have one running: the downwardAPI file read at start may still be stale, and a
    pod whose gate still holds needs no restart to move on."""
    at_start = opened()
    while True:
        now, started = generation(), opened()
        if started is not None and started != at_start and now is not None and now > started:
            print(f"generation {started} -> {now}: restarting the pod's containers", flush=True)
            return RESTART_EXIT
        time.sleep(POLL_SECONDS)


def gate() -> int:
    """Exit 0 once the pod's generation is released and was not opened before."""
    opened_file = os.path.join(STATE, "opened")
    said = False
    while True:
        current, go, last = generation(), released(), opened()
        if current is not None and go == current and (last is None or last < current):
            with open(opened_file + ".tmp", "w") as f:
                f.write(str(current))
            os.replace(opened_file + ".tmp", opened_file)
            print(f"generation {current} released", flush=True)
            return 0
        if not said:
            print(f"holding generation {current} (released: {go}, opened: {last})",
                  flush=True)
            said = True
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    # PID 1 of its container: without a handler SIGTERM would be ignored, and the kubelet's
    # restart of all containers would wait its 2 s minimum grace for every pod.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("watch", "gate"):
        print("usage: agent.py watch|gate", file=sys.stderr)
        sys.exit(2)
    sys.exit(watch() if mode == "watch" else gate())
