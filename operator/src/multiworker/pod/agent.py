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

Both learn the generation and its release two ways and act on whichever comes first: the
operator's word (PUT /generation on the sidecar's port, from the operator, signed with the
job's key, which only this sidecar mounts, and naming this pod's uid: an IP reused by another
pod is refused, and so is a generation more than MAX_LEAD above the pod's own label), and the
labels and annotations through a downwardAPI volume, which the
kubelet refreshes on its own schedule (once in a dozen restarts, 30 s late). Neither needs API
credentials. Both only ever rise, so the higher wins.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same files, as the package has them
    from multiworker.pod import notes, state
else:
    try:  # beside this file, first on sys.path as the pods run it (python3 agent.py ...)
        import notes
        import state
    except ImportError:  # imported from the package (the tests)
        from multiworker.pod import notes, state

RESTART_EXIT = 86
# The warm launcher (launcher.py), PID 1 of the trainer's container where it runs, restarts
# the trainer itself and reports here; the sidecar leaves a new generation to it while it beats,
# and takes over (restarting all containers: the cold path) when it does not stop the old
# trainer within STOP_SECONDS or falls silent for BEAT_SECONDS.
LAUNCHER_STOP_SECONDS = 8.0
LAUNCHER_BEAT_SECONDS = 2.0


def launcher_handles(generation_now: int, rose_at: float) -> bool:
    """Whether the warm launcher is moving its trainer to `generation_now` itself: it beats,
    and it has stopped the old trainer (held) or is still within LAUNCHER_STOP_SECONDS of the
    rise, seen at `rose_at` (monotonic)."""
    report = state.launcher_report()
    if report is None or not isinstance(report.get("beat"), (int, float)):
        return False
    if time.time() - report["beat"] > LAUNCHER_BEAT_SECONDS:
        return False
    held = report.get("state") == "held" and report.get("generation") == generation_now
    return held or time.monotonic() - rose_at < LAUNCHER_STOP_SECONDS


def watch() -> int:
    """Exit RESTART_EXIT once a trainer may run of a generation older than the pod's, unless
    the warm launcher moves it on itself.

    No trainer runs when this sidecar starts (the kubelet starts it first, and a restart of
    all containers stops the others first), so only a generation the gate (or the launcher)
    opens during its life can have one running: the downwardAPI file read at start may still
    be stale, and a pod whose gate still holds needs no restart to move on."""
    notes.listen()
    at_start = state.opened()
    rose_at: float | None = None
    while True:
        now, started = state.generation(), state.opened()
        state.publish(now)
        if started is not None and started != at_start and now is not None and now > started:
            rose_at = rose_at if rose_at is not None else time.monotonic()
            if not launcher_handles(now, rose_at):
                print(f"generation {started} -> {now}: restarting the pod's containers",
                      flush=True)
                return RESTART_EXIT
        else:
            rose_at = None
        time.sleep(state.POLL_SECONDS)


def gate() -> int:
    """Exit 0 once the pod's generation is released and was not opened before."""
    opened_file = os.path.join(state.STATE, "opened")
    said = False
    while True:
        current, go, last = state.generation(), state.released(), state.opened()
        if current is not None and go == current and (last is None or last < current):
            state.publish(current)
            with open(opened_file + ".tmp", "w") as f:
                f.write(str(current))
            os.replace(opened_file + ".tmp", opened_file)
            print(f"generation {current} released", flush=True)
            return 0
        if not said:
            print(f"holding generation {current} (released: {go}, opened: {last})",
                  flush=True)
            said = True
        time.sleep(state.POLL_SECONDS)


if __name__ == "__main__":
    # PID 1 of its container: without a handler SIGTERM would be ignored, and the kubelet's
    # restart of all containers would wait its 2 s minimum grace for every pod.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("watch", "gate"):
        print("usage: agent.py watch|gate", file=sys.stderr)
        sys.exit(2)
    sys.exit(watch() if mode == "watch" else gate())
