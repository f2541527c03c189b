"""The warm launcher of a worker pod's trainer (in-place restarts, pod/agent.py).

A restart of all of a pod's containers starts the trainer's Python anew, and its first 4-5 s go
to importing TensorFlow. As PID 1 of the trainer's container, the launcher restarts the trainer
itself: it keeps one spare interpreter that has already imported the heavy modules, holds each
new generation as the gate does (agent.py's gate), and hands the released one to the spare. Runs
with the python3 of the trainer's image (the operator ships it beside agent.py in the job's
ConfigMap), stdlib only, as `python3 launcher.py`: the user's own command line is in
MWJ_LAUNCHER_ARG_0 ... (MWJ_LAUNCHER_ARGC words, each expanded by the kubelet as in args), the
modules to import ahead in MWJ_LAUNCHER_PRELOAD.

A spare is the user's own command line with the warm hook (warm_hook.py, a sitecustomize in
MWJ_LAUNCHER_HOOK) first on its PYTHONPATH: Python then runs the program itself, as a cold
start would (the same cmdline, sys.argv, sys.path and __main__). The hook imports the preloads,
says "ready" on its status pipe, and waits for its go (the generation's environment) on its
command pipe.

- The first generation, which the gate opened before the container started, starts at once:
  in a spare given its go before it is ready (one way to start a trainer), so still cold.
- A spare starts MWJ_LAUNCHER_SPARE_DELAY s (15) after its trainer, so as not to slow the
  trainers' start-up; not while the container's memory (cgroup v2) could not hold one more
  of the size the last spare had; and no more after two failures in a row: later generations
  then start cold, as before. It is not niced while it imports: once it became the trainer,
  it could not undo that (not as root).
- A rising generation stops the trainer (SIGTERM to its process group, SIGKILL after
  MWJ_LAUNCHER_STOP_SECONDS), is held until released, and the highest one starts.
- A trainer's exit 0 ends the container; any other is recorded, and the launcher stays for
  the operator's next generation.
- STATE/launcher.json says where it stands, rewritten on every change and every BEAT_SECONDS
  (a heartbeat), for the watch sidecar and, through it, the operator.
- It reaps every child (PID 1), passes SIGTERM/SIGINT/SIGHUP to the trainer as SIGTERM (its
  checkpoint on SIGTERM runs) and exits with the trainer's code, and on an error of its own
  kills the trainer and exits 1: the pod's restart rule then restarts all containers, cold.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same file, as the package has it
    from multiworker.pod import children
else:  # beside this file, first on sys.path as the pods run it (python3 launcher.py); a
    # spare never sees this folder (it runs the user's own command line)
    try:
        import children
    except ImportError:  # imported from the package (the tests)
        from multiworker.pod import children


def _number(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


STOP_SECONDS = _number("MWJ_LAUNCHER_STOP_SECONDS", 5)
SPARE_DELAY = _number("MWJ_LAUNCHER_SPARE_DELAY", 15)
SPARE_WAIT = _number("MWJ_LAUNCHER_SPARE_WAIT", 30)
TERMINATION_LOG = os.environ.get("MWJ_LAUNCHER_TERMINATION_LOG", "/dev/termination-log")
BEAT_SECONDS = 0.5
SPARE_FAILURES = 2  # in a row: spares off, later generations start cold
DRAIN_SECONDS = 1.0  # for a trainer's last output after it exits


def termination_log() -> str:
    try:
        with open(TERMINATION_LOG, "rb") as f:
            return f.read(4096).decode(errors="replace").strip()
    except OSError:
        return ""


def clear_termination_log() -> None:
    with contextlib.suppress(OSError):  # none outside Kubernetes
        os.truncate(TERMINATION_LOG, 0)


# --- the launcher ---------------------------------------------------------------------------

class Launcher:
    """Runs the pod's trainers, one generation after another, warm where a spare is ready."""

    def __init__(self, pod: Any, command: children.Command) -> None:
        self.pod, self.command = pod, command  # pod: state.py, the pod's generation
        self.generation, self.rising_to = 0, 0
        self.state, self.path, self.why = "held", "cold", ""
        self.exit: dict[str, Any] | None = None
        self.trainer: children.Child | None = None
        self.spare: children.Child | None = None
        self.children: dict[int, children.Child] = {}
        self.spare_failures, self.spare_rss = 0, 0
        self.spare_off, self.spare_why = False, ""
        self.next_spare_at = self.stop_at = self.released_at = float("inf")
        self.signalled: int | None = None
        self.forwarded = False
        self.version, self.beat_at = 0, 0.0
        self.reported: dict[str, Any] = {}

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        children.become_subreaper()
        self.begin()
        while True:
            self.reap()
            code = self.shut_down() if self.signalled is not None else self.step()
            self.report()
            if code is not None:
                return code
            time.sleep(self.pod.POLL_SECONDS)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = signum

    def begin(self) -> None:
        """Start the generation the gate opened (or hold a newer one)."""
        # A launcher restarted with its container (the kubelet's restart of all of them)
        # counts on from the report its predecessor left in the pod's state: counted from 0
        # again, a version the operator has seen would be news its long poll sits on.
        last = (self.pod.launcher_report() or {}).get("version")
        self.version = last if isinstance(last, int) and not isinstance(last, bool) else 0
        opened, current = self.pod.opened(), self.pod.generation()
        self.generation = opened if opened is not None else current or 0
        if current is not None and current > self.generation:
            self.hold(current)
            return
        self.go(self.start_spare(), "the container's first trainer")

    def step(self) -> int | None:
        """One poll: the spare, the trainer's end, the pod's generation, the next spare."""
        self.watch_spare()
        if self.trainer is not None and self.trainer.importing:
            self.check_ready(self.trainer)
        if self.trainer is not None and self.trainer.status is not None:
            code = self.trainer_ended(self.trainer)
            if code is not None:
                return code
        current: int | None = self.pod.generation()
        if current is not None and current > self.generation:
            self.rise(current)
        if self.state == "stopping" and time.monotonic() >= self.stop_at:
            assert self.trainer is not None
            children.say(f"the trainer outlived {STOP_SECONDS:g}s after SIGTERM: SIGKILL")
            self.trainer.signal_group(signal.SIGKILL)
            self.stop_at = float("inf")
        if self.state == "held":
            self.try_go()
        self.maybe_start_spare()
        return None

    # -- processes

    def reap(self) -> None:
        """Reap every child that ended, ours and orphans alike (we are PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                child.exited(status)

    def adopt(self, child: children.Child) -> children.Child:
        self.children[child.pid] = child
        return child

    def start_spare(self) -> children.Child:
        return self.adopt(children.start_spare(self.command))

    def check_ready(self, child: children.Child) -> None:
        """Whether a spare said "ready" yet; its size then is what the next one needs."""
        if children.heard_ready(child):
            self.spare_rss = children.resident_bytes(child.pid) or self.spare_rss
            self.spare_failures, self.spare_why = 0, ""

    def watch_spare(self) -> None:
        spare = self.spare
        if spare is None:
            return
        self.check_ready(spare)
        if spare.status is not None:  # ended before its go
            self.spare = None
            spare.close_pipes()
            self.spare_failed(spare.describe_failure())

    def spare_failed(self, reason: str) -> None:
        self.spare_failures += 1
        if self.spare_failures >= SPARE_FAILURES:
            self.spare_off, self.spare_why = True, f"failed twice in a row: {reason}"
            children.say(f"spare failed ({reason}); no more spares: later generations start cold")
        else:
            self.spare_why = f"failed: {reason}"
            children.say(f"spare failed ({reason})")

    def dismiss_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is None:
            return
        spare.signal_group(signal.SIGKILL)
        if spare.status is None:
            spare.exited(os.waitpid(spare.pid, 0)[1])
            self.children.pop(spare.pid, None)
        spare.close_pipes()

    def maybe_start_spare(self) -> None:
        """Start the next spare once it is due, there is room for it, and none is importing."""
        if self.spare is not None or self.spare_failures >= SPARE_FAILURES or \
                time.monotonic() < self.next_spare_at or \
                (self.trainer is not None and self.trainer.importing):
            return
        short = children.memory_short(self.spare_rss)
        if short:
            if not self.spare_off:
                children.say(f"no spare: {short}")
            self.spare_off, self.spare_why = True, short
            return
        self.spare_off = False
        self.spare = self.start_spare()

    # -- generations

    def go(self, spare: children.Child | None, why: str) -> None:
        """Start the trainer of self.generation: in `spare` (warm where it is ready and no
        `why` says otherwise), or cold."""
        if why:
            how = f"cold start ({why})"
        else:
            assert spare is not None and spare.ready_at is not None
            how = f"warm start (spare ready for {time.monotonic() - spare.ready_at:.1f}s)"
        clear_termination_log()
        worker = os.environ.get("MWJ_WORKER_INDEX", "?")
        children.emit(f"==== multiworker: generation {self.generation} of worker {worker}, {how} "
             f"at {children.utc_now()} ====\n".encode())
        env = {**os.environ, "MWJ_RESTART_COUNT": str(self.generation),
               "PYTHONUNBUFFERED": "1"}
        self.trainer = self.send_go(spare, env) if spare is not None else self.start_cold(env)
        self.trainer.trained_from = children.utc_now()
        self.state, self.path, self.why, self.exit = "running", "cold" if why else "warm", \
            why, None
        self.next_spare_at = time.monotonic() + SPARE_DELAY

    def send_go(self, spare: children.Child, env: dict[str, str]) -> children.Child:
        """The go: one JSON line on the spare's command pipe, from a thread of its own (an
        importing spare reads it only when ready, and a pipe holds 64 KiB)."""
        go = {"env": env}
        fd, spare.command_fd = spare.command_fd, None
        assert fd is not None
        spare.output.go_live()
        threading.Thread(target=children.send, args=(fd, json.dumps(go).encode() + b"\n"),
                         daemon=True).start()
        return spare

    def start_cold(self, env: dict[str, str]) -> children.Child:
        return self.adopt(children.start_child(self.command.line, env, live=True))

    def trainer_ended(self, trainer: children.Child) -> int | None:
        """The trainer's process ended: end its group, and go on as its exit says. An exit 0
        ends the launcher (returned); a spare that failed before its first go is replaced by
        a cold start."""
        self.check_ready(trainer)
        failed_spare = trainer.importing
        self.trainer = None
        trainer.signal_group(signal.SIGKILL)  # what is left of its tree, as a container's end
        trainer.close_pipes()
        trainer.output.drain(DRAIN_SECONDS)
        if failed_spare and self.state == "running":
            self.spare_failed(trainer.describe_failure())
            self.go(None, f"spare {self.spare_why}")
            return None
        assert trainer.status is not None
        if self.state == "stopping":
            self.hold(self.rising_to)
            return None
        code, signum = children.exit_code(trainer.status)
        self.state, self.exit = "exited", self.exit_record(code, signum, trainer)
        self.next_spare_at = min(self.next_spare_at, time.monotonic())  # no trainer to slow
        if code == 0:
            self.dismiss_spare()
            return 0
        return None

    @staticmethod
    def exit_record(code: int, signum: int | None, trainer: children.Child) -> dict[str, Any]:
        """The trainer's end as the kubelet would have reported its container's."""
        return {"exitCode": code, "signal": signum, "reason": "Completed" if code == 0
                else "Error", "message": termination_log() or trainer.output.last_lines(),
                "startedAt": trainer.trained_from or None, "finishedAt": children.utc_now()}

    def rise(self, current: int) -> None:
        """The pod's generation rose to `current`: stop the trainer, or hold."""
        if self.trainer is None:
            self.hold(current)
        elif self.state == "stopping":
            self.rising_to = max(self.rising_to, current)
        else:
            children.say(f"generation {self.generation} -> {current}: stopping the trainer")
            self.state, self.rising_to = "stopping", current
            self.stop_at = time.monotonic() + STOP_SECONDS
            self.trainer.signal_group(signal.SIGTERM)

    def hold(self, generation: int) -> None:
        self.state, self.generation, self.exit = "held", generation, None
        self.released_at = float("inf")
        self.next_spare_at = min(self.next_spare_at, time.monotonic())  # no trainer to slow

    def try_go(self) -> None:
        """Go once the held generation is released and not yet opened (the gate's rule), in
        the spare once it is ready (it is ahead of a cold start: up to SPARE_WAIT s)."""
        current, released, opened = (self.pod.generation(), self.pod.released(),
                                     self.pod.opened())
        if current != self.generation or released != current or \
                (opened is not None and opened >= current):
            return
        spare = self.spare
        if spare is not None and spare.ready_at is None:
            now = time.monotonic()
            self.released_at = min(self.released_at, now)
            if now - self.released_at < SPARE_WAIT:
                return
            self.dismiss_spare()
            self.spare_failed(f"not ready {SPARE_WAIT:g}s after the release")
            spare = None
        self.open(current)
        self.spare = None
        self.go(spare, "" if spare is not None else self.cold_why())

    def cold_why(self) -> str:
        if self.spare_why:
            return f"no spare: {self.spare_why}"
        return f"no spare yet: one starts {SPARE_DELAY:g}s after a trainer"

    def open(self, generation: int) -> None:
        """Mark `generation` opened, as the gate does."""
        self.pod.publish(generation)
        opened_file = os.path.join(self.pod.STATE, "opened")
        with open(opened_file + ".tmp", "w") as f:
            f.write(str(generation))
        os.replace(opened_file + ".tmp", opened_file)

    # -- the end

    def shut_down(self) -> int | None:
        """We were told to stop: the trainer is, by SIGTERM; its exit code becomes ours."""
        trainer = self.trainer
        if not self.forwarded:
            self.forwarded = True
            assert self.signalled is not None
            children.say(f"{signal.Signals(self.signalled).name}: stopping the trainer")
            self.dismiss_spare()
            self.state = "stopping"
            if trainer is not None:
                trainer.signal_group(signal.SIGTERM)
        if trainer is None:
            self.state = "exited"
            return 128 + (self.signalled or 0)
        if trainer.status is None:
            return None
        self.trainer = None
        trainer.signal_group(signal.SIGKILL)
        trainer.output.drain(DRAIN_SECONDS)
        code, signum = children.exit_code(trainer.status)
        self.state, self.exit = "exited", self.exit_record(code, signum, trainer)
        return code

    def kill_all(self) -> None:
        """After an error of our own: nothing of ours may outlive us."""
        for child in (self.trainer, self.spare):
            if child is not None:
                child.signal_group(signal.SIGKILL)

    def spare_state(self) -> str:
        if self.spare is not None:
            return "ready" if self.spare.ready_at is not None else "starting"
        return "off" if self.spare_off else "none"

    def report(self) -> None:
        """STATE/launcher.json: on every change (a new version), and as a heartbeat."""
        now = time.monotonic()
        news = {"generation": self.generation, "state": self.state, "path": self.path,
                "why": self.why, "spare": self.spare_state(), "spareWhy": self.spare_why,
                "exit": self.exit, "trainerPid": self.trainer.pid if self.trainer else None,
                "sparePid": self.spare.pid if self.spare else None}
        if news != self.reported:
            self.version, self.reported = self.version + 1, news
        elif now - self.beat_at < BEAT_SECONDS:
            return
        path = os.path.join(self.pod.STATE, self.pod.LAUNCHER_REPORT)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "version": self.version, "beat": time.time(),
                       **news}, f)
        os.replace(tmp, path)
        self.beat_at = now


def main() -> int:
    command = children.rendered_command()
    import state  # beside this file (sys.path[0]); not in a spare, whose user may have one

    launcher = Launcher(state, command)
    try:
        return launcher.run()
    except Exception:
        traceback.print_exc()
        launcher.kill_all()
        return 1


if __name__ == "__main__":
    sys.exit(main())
