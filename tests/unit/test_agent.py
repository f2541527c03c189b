"""The in-place agent as the pods run it (pod/agent.py, as a script with python3): the
sidecar exits 86 only when a trainer of an older generation may run; the gate opens each
generation once, when it is released."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from multiworker.clients import agents
from multiworker.clients.agents import AgentNote, note_body, note_url
from multiworker.pod import notes
from multiworker.reconcile.render import shipped_items, shipped_scripts

from tests.support import free_port, wait_for

KEY = b"0123456789abcdef" * 4  # the job's key, as its Secret holds it (hex text)


def start(tmp_path: Path, mode: str, port: int = 0) -> subprocess.Popen[bytes]:
    for item in shipped_items():  # as the job's ConfigMap volume lays them out
        path = tmp_path / item["path"]
        path.parent.mkdir(exist_ok=True)
        path.write_text(shipped_scripts()[item["key"]])
    script = tmp_path / "agent.py"
    env = {"MWJ_AGENT_POD_INFO": str(tmp_path / "pod"),
           "MWJ_AGENT_STATE": str(tmp_path / "state"),
           "MWJ_AGENT_PORT": str(port), "MWJ_AGENT_POD_UID": "uid-1",
           "MWJ_AGENT_KEY_FILE": str(tmp_path / "key" / "key")}
    return subprocess.Popen([sys.executable, str(script), mode], env=env,
                            stdout=subprocess.DEVNULL)


def write(tmp_path: Path, **files: int) -> None:
    for name, value in files.items():
        folder = tmp_path / ("state" if name == "opened" else "pod")
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(str(value))


def first_poll_done(tmp_path: Path, proc: subprocess.Popen[bytes]) -> None:
    """Wait until a fresh sidecar has read where it starts from (its first poll publishes the
    pod's generation): a write before that would be its starting point, not news to it — on
    a busy machine the interpreter alone can take longer than the test's next step."""
    wait_for(lambda: (tmp_path / "state" / "pod-generation").exists() or proc.poll() is not None,
             30, interval=0.02, describe="the sidecar's first poll")


def catches(proc: subprocess.Popen[bytes], signum: int) -> bool:
    """Whether the process installed a handler for `signum` (Linux: /proc's SigCgt mask), so
    a test does not signal an interpreter still starting up on a busy machine."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def still_running(proc: subprocess.Popen[bytes], seconds: float = 0.3) -> bool:
    time.sleep(seconds)
    return proc.poll() is None


@pytest.fixture(autouse=True)
def folders(tmp_path: Path) -> None:
    (tmp_path / "pod").mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "key").mkdir()
    (tmp_path / "key" / "key").write_bytes(KEY + b"\n")


def test_the_sidecar_restarts_the_pod_once_a_trainer_of_an_older_generation_may_run(
    tmp_path: Path,
) -> None:
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch")
    first_poll_done(tmp_path, watch)
    try:
        assert still_running(watch)
        write(tmp_path, opened=0)  # the gate let generation 0's trainer start
        assert still_running(watch)
        write(tmp_path, generation=1)
        assert watch.wait(5) == 86
    finally:
        watch.kill()


def test_the_sidecar_leaves_a_pod_whose_gate_holds_alone(tmp_path: Path) -> None:
    """Started after a restart of all containers (no trainer runs), with a stale or a newer
    generation: nothing to stop."""
    write(tmp_path, generation=0, released=0, opened=0)
    watch = start(tmp_path, "watch")
    first_poll_done(tmp_path, watch)
    try:
        write(tmp_path, generation=1)
        assert still_running(watch)
        write(tmp_path, released=1, opened=1)  # released: generation 1's trainer starts
        assert still_running(watch)
        write(tmp_path, generation=2)
        assert watch.wait(5) == 86
    finally:
        watch.kill()


def test_the_gate_opens_each_generation_once_when_released(tmp_path: Path) -> None:
    write(tmp_path, generation=1, released=0, opened=0)
    gate = start(tmp_path, "gate")
    try:
        assert still_running(gate)
        write(tmp_path, released=1)
        assert gate.wait(5) == 0
        assert (tmp_path / "state" / "opened").read_text() == "1"
    finally:
        gate.kill()
    again = start(tmp_path, "gate")  # generation 1's trainer ended: held until decided
    try:
        assert still_running(again)
    finally:
        again.kill()


@pytest.mark.parametrize("mode", ["watch", "gate"])
def test_sigterm_stops_the_agent_at_once(tmp_path: Path, mode: str) -> None:
    """As PID 1 of its container a process without a handler ignores SIGTERM: the kubelet
    would wait 2 s to kill it in every restart of the pod's containers."""
    write(tmp_path, generation=1, released=0, opened=0)
    proc = start(tmp_path, mode)
    try:
        wait_for(lambda: catches(proc, signal.SIGTERM), 20, 0.05,
                 "the agent to install its SIGTERM handler")
        assert still_running(proc)
        proc.terminate()
        assert proc.wait(2) == 143
    finally:
        proc.kill()


def tell(port: int, uid: str, generation: int, released: int | None = None,
         key: bytes | None = KEY, now: float | None = None,
         body: dict[str, object] | None = None) -> int:
    """PUT a note as the operator does (clients/agents.py), signed with `key` at `now`, or
    `body` as it is; the agent's answer."""
    note = AgentNote("127.0.0.1", port, uid, generation, released, key=key)
    request = urllib.request.Request(note_url(note), method="PUT",
                                     data=json.dumps(body or note_body(note, now)).encode())
    deadline = time.monotonic() + 5
    while True:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:  # not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_operators_word_moves_the_pod_on_before_its_labels_do(tmp_path: Path) -> None:
    """The downwardAPI files stay at generation 0 throughout (a kubelet that has not
    refreshed them): the notes alone restart the pod and then release its gate."""
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    gate: subprocess.Popen[bytes] | None = None
    try:
        assert tell(port, "uid-other", 1) == 409  # an IP reused by another pod
        assert still_running(watch)
        write(tmp_path, opened=0)  # the gate let generation 0's trainer start
        assert tell(port, "uid-1", 1) == 204
        assert watch.wait(5) == 86
        # The old trainer, stopped now, learns its pod moved on (MWJ_POD_GENERATION_FILE).
        assert (tmp_path / "state" / "pod-generation").read_text() == "1"
        watch = start(tmp_path, "watch", port)  # the kubelet restarts the pod's containers
        gate = start(tmp_path, "gate")
        assert still_running(gate)  # generation 1, not released yet
        assert tell(port, "uid-1", 1, released=1) == 204
        assert gate.wait(5) == 0
        assert (tmp_path / "state" / "opened").read_text() == "1"
        assert tell(port, "uid-1", 0, released=0) == 204  # late and lower: kept higher
        assert (tmp_path / "state" / "told-generation").read_text() == "1"
        assert still_running(watch)
    finally:
        watch.kill()
        if gate is not None:
            gate.kill()


def test_a_note_the_operator_could_not_have_sent_is_refused(tmp_path: Path) -> None:
    """Anyone who can list pods can name a pod's uid. A generation more than one ahead of the
    pod's own label, or a release past the generation, is refused and kept nowhere: it would
    open the gate and be fenced, superseding every later real generation."""
    port = free_port()
    write(tmp_path, generation=3, released=3)
    watch = start(tmp_path, "watch", port)
    try:
        assert tell(port, "uid-1", 10**6) == 403
        assert tell(port, "uid-1", 3, released=9) == 403
        assert tell(port, "uid-1", 4, released=5) == 403
        assert not (tmp_path / "state" / "told-generation").exists()
        assert not (tmp_path / "state" / "told-released").exists()
        assert tell(port, "uid-1", 4, released=4) == 204  # the next generation, as the operator
        assert (tmp_path / "state" / "told-generation").read_text() == "4"
    finally:
        watch.kill()


def threads_of(proc: subprocess.Popen[bytes]) -> int:
    status = Path(f"/proc/{proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_idle_connections_neither_grow_the_sidecar_nor_keep_the_operator_out(
    tmp_path: Path,
) -> None:
    """A flood of connections that send nothing: a few are served at a time (each dropped
    after READ_SECONDS), the rest closed at once, so the 64 Mi sidecar neither grows a thread
    per connection nor stops hearing the operator once they are gone."""
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    idle: list[socket.socket] = []
    try:
        assert tell(port, "uid-1", 0) == 204  # listening
        for _ in range(40):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        time.sleep(0.5)
        assert threads_of(watch) <= 16, threads_of(watch)  # not one per connection
        def heard() -> bool:
            try:
                return tell(port, "uid-1", 1) == 204
            except OSError:  # closed at once while the slots are taken
                return False

        wait_for(heard, 30, interval=0.5,
                 describe="the operator's note heard again once the idle connections drop")
        assert (tmp_path / "state" / "told-generation").read_text() == "1"
    finally:
        for s in idle:
            s.close()
        watch.kill()


def test_clients_trickling_their_requests_cannot_keep_the_operator_out(tmp_path: Path) -> None:
    """Reproduced: eight connections sending a byte every 3 s (a per-read timeout never
    fires) kept the operator's notes refused for as long as they went on. A request now has
    READ_SECONDS in all, and a newer connection takes the slot of the oldest unnamed one."""
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    stop = threading.Event()
    dropped: list[float] = []

    def trickle() -> None:
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            try:
                for byte in b"PUT /generation HTTP/1.0\r\n":
                    if stop.wait(1.0):
                        return
                    conn.sendall(bytes([byte]))
                    conn.settimeout(0.01)
                    with contextlib.suppress(socket.timeout):
                        if conn.recv(1) == b"":
                            raise ConnectionResetError
                    conn.settimeout(10)
            except OSError:
                dropped.append(time.monotonic() - began)

    try:
        wait_for(lambda: _heard(port, 0), 30, interval=0.2, describe="the agent listening")
        slow = [threading.Thread(target=trickle, daemon=True) for _ in range(8)]
        for thread in slow:
            thread.start()
        time.sleep(1.5)  # every slot taken by a trickler
        for generation in (1, 1, 1):
            started = time.monotonic()
            assert _heard(port, generation), "the operator's note refused"
            assert time.monotonic() - started < 2
            time.sleep(0.5)
        wait_for(lambda: len(dropped) == 8, 20, interval=0.2,
                 describe="every trickler dropped by the deadline or a newer connection")
        # Each trickler notices its drop at its next byte (1 s apart), and a loaded machine
        # delays the reaper's rounds: well within twice the deadline, against the tricklers'
        # 26 s of bytes, for which the per-read timeout once held them all.
        assert max(dropped) < 2 * notes.READ_SECONDS, dropped
    finally:
        stop.set()
        watch.kill()


def _heard(port: int, generation: int) -> bool:
    try:
        return tell(port, "uid-1", generation) == 204
    except OSError:
        return False


def test_only_a_note_signed_with_the_jobs_key_moves_the_pod(tmp_path: Path) -> None:
    """Reproduced before notes were signed: one PUT naming the pod's uid and generation+1
    (anyone who can list pods knows both) made the trainer see itself superseded, and a
    second one opened a generation the operator never released. Every note now carries the
    signature of the job's key (a Secret only the operator and this sidecar read) over what
    it says and its expiry; the agent checks it before anything else."""
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    try:
        wait_for(lambda: _heard(port, 0), 30, interval=0.2, describe="the agent listening")
        assert tell(port, "uid-1", 1, key=None) == 401  # unsigned
        assert tell(port, "uid-1", 1, key=b"another job's key") == 401
        forged = note_body(AgentNote("127.0.0.1", port, "uid-1", 0, key=KEY))
        assert tell(port, "uid-1", 1, body={**forged, "generation": 1}) == 401  # altered
        assert tell(port, "uid-other", 1, body={**forged, "uid": "uid-other"}) == 401
        stale = time.time() - agents.NOTE_LIFETIME_SECONDS - 5
        assert tell(port, "uid-1", 1, now=stale) == 401  # expired: replayed later
        assert (tmp_path / "state" / "told-generation").read_text() == "0"  # _heard's
        assert tell(port, "uid-1", 1) == 204  # the operator's
        assert (tmp_path / "state" / "told-generation").read_text() == "1"
    finally:
        watch.kill()


def test_an_agent_without_its_key_refuses_every_note_until_the_key_is_mounted(
    tmp_path: Path,
) -> None:
    """The key's volume is optional (a pod whose Secret is missing still starts): its agent
    cannot check a note, so it hears the labels alone; the kubelet may mount the key later."""
    (tmp_path / "key" / "key").unlink()
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    try:
        wait_for(lambda: _answer(port) is not None, 30, interval=0.2,
                 describe="the agent listening")
        assert tell(port, "uid-1", 1) == 401
        (tmp_path / "key" / "key").write_bytes(KEY)
        assert tell(port, "uid-1", 1) == 204
    finally:
        watch.kill()


def _answer(port: int) -> int | None:
    try:
        return tell(port, "uid-1", 0)
    except OSError:
        return None
