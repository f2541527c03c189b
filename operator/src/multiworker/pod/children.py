"""The warm launcher's child processes (launcher.py): the trainer and its spare interpreters —
the user's command line they run (cold, or as a spare with the warm hook first on its
PYTHONPATH), their output copied to the launcher's whole, their process groups and exits.
Shipped beside launcher.py in the job's ConfigMap; stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same file, as the package has it
    from multiworker.pod import state
else:
    try:  # beside this file, first on sys.path as the pods run it (python3 launcher.py)
        import state
    except ImportError:  # imported from the package (the tests)
        from multiworker.pod import state

# The user's own command line, as the operator renders it (api/contract.py's names).
ARGC_ENV = "MWJ_LAUNCHER_ARGC"  # how many words; the words in ARG_ENV0, ARG_ENV1, ...
ARG_ENV = "MWJ_LAUNCHER_ARG_"
PRELOAD_ENV = "MWJ_LAUNCHER_PRELOAD"  # comma-separated
HOOK_ENV = "MWJ_LAUNCHER_HOOK"  # the folder of the spares' sitecustomize (warm_hook.py)
WARM_FDS = "MWJ_WARM_FDS"  # warm_hook.py's: "<status fd>,<command fd>"
DEFAULT_PRELOAD = "tensorflow"
TAIL_BYTES = 4096  # of a trainer's output, for its exit record
HELD_BYTES = 1 << 16  # of a spare's output before its go, shown after its header
MESSAGE_LINES, MESSAGE_BYTES = 20, 2048
PREFIX = "multiworker launcher: "
CGROUP = os.environ.get("MWJ_LAUNCHER_CGROUP", "/sys/fs/cgroup")
MEMORY_MARGIN = 1.5  # free memory needed, in sizes of the last spare


_stdout = threading.Lock()


def emit(data: bytes) -> None:
    """Write to our stdout whole (the trainers' bytes and our lines never interleave)."""
    with _stdout:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(1, view):]
        except OSError:
            pass  # no one reads our stdout: nothing to tell


def say(text: str) -> None:
    emit(f"{PREFIX}{text}\n".encode())


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Output:
    """A child's stdout and stderr (one pipe), copied to ours byte for byte once it is live;
    a spare's is held until its go (after its header), and the last TAIL_BYTES are kept."""

    def __init__(self, fd: int, live: bool) -> None:
        self.live, self.held, self.tail = live, bytearray(), bytearray()
        self._fd, self._lock = fd, threading.Lock()
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        while data := os.read(self._fd, 65536):
            with self._lock:
                self.tail += data
                del self.tail[:-TAIL_BYTES]
                if self.live:
                    emit(data)
                else:
                    self.held += data
                    del self.held[:-HELD_BYTES]
        os.close(self._fd)

    def go_live(self) -> None:
        with self._lock:
            emit(bytes(self.held))
            self.held.clear()
            self.live = True

    def drain(self, timeout: float) -> None:
        """Wait for the pipe's end (every writer gone), for at most `timeout` s."""
        self._thread.join(timeout)

    def last_lines(self) -> str:
        with self._lock:
            lines = self.tail.decode(errors="replace").splitlines()[-MESSAGE_LINES:]
        return "\n".join(lines).encode()[-MESSAGE_BYTES:].decode(errors="ignore")


@dataclass
class Child:
    """A process we started, in a session of its own: a spare (with its status and command
    pipes) or a trainer started cold."""

    popen: subprocess.Popen[bytes]
    output: Output
    status_fd: int | None = None
    command_fd: int | None = None
    ready_at: float | None = None  # monotonic
    status: int | None = None  # waitpid's, once reaped
    trained_from: str = ""  # when it became the trainer (UTC): the kubelet's startedAt
    said: str = ""  # on its status pipe, other than "ready": why it failed (warm_hook.py)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def importing(self) -> bool:
        return self.status_fd is not None and self.ready_at is None

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
            os.killpg(self.pid, signum)

    def exited(self, status: int) -> None:
        self.status = status
        self.popen.returncode = os.waitstatus_to_exitcode(status)  # Popen never waits now

    def close_pipes(self) -> None:
        for fd in (self.status_fd, self.command_fd):
            if fd is not None:
                os.close(fd)
        self.status_fd = self.command_fd = None

    def describe_failure(self) -> str:
        """Why a spare ended: its exit, and the last line it wrote."""
        code, signum = exit_code(self.status or 0)
        what = f"killed by signal {signum}" if signum else f"exit {code}"
        lines = [line for line in self.output.last_lines().splitlines() if line.strip()]
        last = self.said or (lines[-1].strip() if lines else "")
        return f"{what}: {last[:300]}" if last else what


def exit_code(status: int) -> tuple[int, int | None]:
    """The exit code as the kubelet reports it (128+N for signal N), and the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), None


def start_child(argv: list[str], env: dict[str, str], live: bool,
                keep: tuple[int, ...] = ()) -> Child:
    """Start `argv` in a session of its own (its process group is the trainer's tree), with
    stdout and stderr on one pipe to us, and the fds `keep` open."""
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(argv, env=env, stdout=write_fd, stderr=write_fd,
                                 pass_fds=keep, start_new_session=True)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Child(popen, Output(read_fd, live))


def start_spare(command: Command) -> Child:
    """A spare: the user's command line with the warm hook, its status pipe (it says "ready"
    there once its preloads are imported) and its command pipe (its go) kept open."""
    status_read, status_write = os.pipe()
    command_read, command_write = os.pipe()
    argv, env = command.spare(status_write, command_read)
    try:
        child = start_child(argv, env, live=False, keep=(status_write, command_read))
    except BaseException:
        os.close(status_read)
        os.close(command_write)
        raise
    finally:
        os.close(status_write)
        os.close(command_read)
    os.set_blocking(status_read, False)
    child.status_fd, child.command_fd = status_read, command_write
    return child


def heard_ready(child: Child) -> bool:
    """Whether a spare still importing has just said "ready" on its status pipe (anything
    else it says is why it fails, kept for its failure's description)."""
    if not child.importing:
        return False
    assert child.status_fd is not None
    try:
        said = os.read(child.status_fd, 4096)
    except BlockingIOError:
        return False
    if not said.startswith(b"ready"):
        child.said = child.said or said.decode(errors="replace").strip()
        return False
    child.ready_at = time.monotonic()
    return True


def memory_short(spare_rss: int) -> str:
    """Why one more spare of `spare_rss` bytes would not fit in the container's memory
    (cgroup v2), or ""."""
    limit, used = (state.read_number(os.path.join(CGROUP, name))
                   for name in ("memory.max", "memory.current"))  # "max": no limit
    if not spare_rss or limit is None or used is None:
        return ""
    free = limit - used
    if free >= MEMORY_MARGIN * spare_rss:
        return ""
    return (f"memory too tight: {free >> 20} MiB free of the container's {limit >> 20} "
            f"MiB, a spare takes {spare_rss >> 20} MiB (x{MEMORY_MARGIN:g})")


def become_subreaper() -> None:
    """Orphans of the trainer's tree come to us to be reaped, as to PID 1 in its container,
    also where we are not PID 1 (a shared process namespace, a test)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (ImportError, OSError, AttributeError):
        pass  # not Linux, or no ctypes in the image: PID 1 reaps them all the same


def resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@dataclass(frozen=True)
class Command:
    """The user's command line, started cold as it is, or as a spare: with the warm hook
    first on its PYTHONPATH."""

    line: list[str]
    preloads: list[str]
    hook: str

    def spare(self, status_fd: int, command_fd: int) -> tuple[list[str], dict[str, str]]:
        """A spare's command line and environment, given the ends of its pipes."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        path = os.pathsep.join(filter(None, [self.hook, env.get("PYTHONPATH")]))
        return self.line, {**env, "PYTHONPATH": path, WARM_FDS: f"{status_fd},{command_fd}",
                           PRELOAD_ENV: ",".join(self.preloads)}


def rendered_command() -> Command:
    """The command as the operator renders it (render.py's _wrap_in_launcher)."""
    count = os.environ.get(ARGC_ENV, "")
    names = [f"{ARG_ENV}{i}" for i in range(int(count))] if count.isdigit() else []
    missing = [name for name in names if name not in os.environ]
    if not names or missing:
        raise SystemExit(f"no command line: {ARGC_ENV}={count!r}, unset: {missing}")
    line = [os.environ[name] for name in names]
    hook = os.environ.get(HOOK_ENV) or os.path.join(os.path.dirname(__file__), "warm")
    preloads = os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD)
    return Command(line, [m for m in preloads.split(",") if m], hook)


def send(fd: int, message: bytes) -> None:
    """Write `message` to a spare's command pipe and close it."""
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(message)
    except OSError:
        pass  # the spare died: its end tells
