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

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

POD_INFO = os.environ.get("MWJ_AGENT_POD_INFO", "/etc/multiworker")
STATE = os.environ.get("MWJ_AGENT_STATE", "/run/multiworker")
PORT = int(os.environ.get("MWJ_AGENT_PORT", "0") or 0)  # 0: hear only the downwardAPI
POD_UID = os.environ.get("MWJ_AGENT_POD_UID", "")
# The job's key (a Secret the operator creates, mounted into this sidecar alone, never the
# trainer's container): a note must carry its signature (clients/agents.py). No key: every
# note is refused, and the labels alone tell.
KEY_FILE = os.environ.get("MWJ_AGENT_KEY_FILE", "")
NOTE_PATH = "/generation"  # api/contract.py's AGENT_NOTE_PATH
TRAINER_PATH = "/trainer"  # api/contract.py's AGENT_TRAINER_PATH
RESTART_EXIT = 86
POLL_SECONDS = 0.05
# The warm launcher (launcher.py), PID 1 of the trainer's container where it runs, restarts
# the trainer itself and reports here; the sidecar leaves a new generation to it while it beats,
# and takes over (restarting all containers: the cold path) when it does not stop the old
# trainer within STOP_SECONDS or falls silent for BEAT_SECONDS.
LAUNCHER_REPORT = "launcher.json"
LAUNCHER_STOP_SECONDS = 8.0
LAUNCHER_BEAT_SECONDS = 2.0
# GET /trainer answers at once when the report differs from the version the caller has seen,
# and otherwise when it changes, or after at most this long (a long poll).
MAX_WAIT_SECONDS = 20.0
# The operator relabels a pod one generation at a time and tells it then, so a told generation
# leads the pod's own label (the downwardAPI file, which the kubelet refreshes late) by one at
# most, and a told release never passes the generation. A note claiming more is refused:
# anyone who can list pods can name a pod's uid, and a far-future generation would open the
# gate and be fenced (fence.json), superseding every later real one.
MAX_LEAD = 1
# The port serves the operator alone: a few connections at a time, each with READ_SECONDS in
# all to name this pod's uid (its request read whole), so a flood can neither stall nor
# exhaust the sidecar. When every slot is taken, a new connection takes the slot of the oldest
# one that has not named the uid yet: eight clients trickling a byte every few seconds once
# kept the operator's notes refused for as long as they went on.
MAX_CONNECTIONS = 8
READ_SECONDS = 5.0
REAP_SECONDS = 0.5


def _read(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _higher(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def generation() -> int | None:
    return _higher(_read(os.path.join(POD_INFO, "generation")),
                   _read(os.path.join(STATE, "told-generation")))


def released() -> int | None:
    return _higher(_read(os.path.join(POD_INFO, "released")),
                   _read(os.path.join(STATE, "told-released")))


def _keep(name: str, value: object) -> None:
    """Keep a told value if it is higher than the one kept (tmp + rename: the gate never
    reads half a number)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return
    path = os.path.join(STATE, name)
    kept = _read(path)
    if kept is not None and kept >= value:
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # the gate writes here too
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, path)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def plausible(note: dict[str, object]) -> bool:
    """Whether the operator could have sent the note (MAX_LEAD), judged by the pod's label."""
    label = _read(os.path.join(POD_INFO, "generation"))
    if label is None:
        return False  # nothing to judge it by: the downwardAPI will tell
    told, release = _count(note.get("generation")), _count(note.get("released"))
    if (told is None and note.get("generation") is not None) or \
            (release is None and note.get("released") is not None):
        return False
    if told is not None and told > label + MAX_LEAD:
        return False
    ceiling = _higher(label, told, _read(os.path.join(STATE, "told-generation"))) or 0
    return release is None or release <= ceiling


def _key() -> bytes | None:
    """Read on every note: the kubelet may mount the Secret after the sidecar starts."""
    try:
        with open(KEY_FILE, "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None


def unsigned(note: dict[str, object], now: float) -> str | None:
    """Why the note is not the operator's, or None: signed with the job's key over what it
    says and when it expires (clients/agents.py's signature), and not expired."""
    key = _key() if KEY_FILE else None
    if key is None:
        return "this agent has no key to check notes with"
    expires, given = note.get("expires"), note.get("signature")
    if not isinstance(expires, int) or isinstance(expires, bool) or not isinstance(given, str):
        return "the note is not signed"
    message = json.dumps([NOTE_PATH, note.get("uid"), note.get("generation"),
                          note.get("released"), expires], separators=(",", ":"))
    expected = hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        return "the note's signature does not match this job's key"
    if now > expires:
        return (f"the note expired {now - expires:.0f}s ago by this node's clock "
                "(is it off from the operator's?)")
    return None


def launcher_report() -> dict[str, Any] | None:
    """What the warm launcher last wrote (launcher.py), None where it runs not."""
    try:
        with open(os.path.join(STATE, LAUNCHER_REPORT)) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _wait_for_news(seen: int | None, wait: float) -> dict[str, Any]:
    """The launcher's report once its version is not `seen`, or as it is after `wait` s."""
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
    while True:
        report = launcher_report() or {}
        if report.get("version") != seen or time.monotonic() >= deadline:
            return report
        time.sleep(POLL_SECONDS)


class _Told(BaseHTTPRequestHandler):
    """PUT /generation {"uid": ..., "generation": N, "released": M}: the operator's word.
    GET /trainer?uid=...&version=N&wait=S: the warm launcher's report, for the operator (a
    long poll: answered when the report is not version N, or after S seconds)."""

    timeout = READ_SECONDS  # per read; the server bounds the whole request (_Server.reap)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path, _, query = self.path.partition("?")
        asked = {k: v[-1] for k, v in parse_qs(query).items()}
        if path != TRAINER_PATH:
            self._answer(404)
        elif not POD_UID or asked.get("uid") != POD_UID:
            self._answer(409)  # another pod's IP: its report is not this pod's
        else:
            self.server.identified(self.request)  # type: ignore[attr-defined]
            try:
                seen = int(asked["version"]) if "version" in asked else None
                wait = float(asked.get("wait", "0"))
            except ValueError:
                self._answer(400)
                return
            self._answer(200, json.dumps(_wait_for_news(seen, wait)).encode())

    def _answer(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.send_response(code)
        if body:
            self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802 (http.server's name)
        try:
            length = min(int(self.headers.get("Content-Length") or 0), 4096)
            note = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            note = None
        refused = unsigned(note, time.time()) if isinstance(note, dict) else None
        if self.path != NOTE_PATH or not isinstance(note, dict):
            self.send_response(400)
        elif refused is not None:
            if refused not in _said:  # once per reason: a flood of forgeries floods no log
                _said.add(refused)
                print(f"refused a note: {refused}", flush=True)
            self._answer(401, refused.encode(), "text/plain")
            return
        elif not POD_UID or note.get("uid") != POD_UID:
            self.send_response(409)  # another pod's IP, once: not ours to act on
        elif not plausible(note):
            self.send_response(403)
        else:
            self.server.identified(self.request)  # type: ignore[attr-defined]
            with _lock:
                _keep("told-generation", note.get("generation"))
                _keep("told-released", note.get("released"))
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


_lock = threading.Lock()
_said: set[str] = set()


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS served at once; a connection that has not named this pod's uid
    within READ_SECONDS is dropped, and gives its slot to a newer one when all are taken. This
    file is shipped alone (the job's ConfigMap) and runs in any image with python3, so it
    cannot share runtime/progress.py's server."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._guard = threading.Lock()
        self._counted: set[Any] = set()  # connections holding a slot
        self._pending: dict[Any, float] = {}  # of those, not identified yet: since when
        super().__init__(*args, **kwargs)
        threading.Thread(target=self.reap, daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            if len(self._counted) >= MAX_CONNECTIONS and not self._pending:
                self.shutdown_request(request)  # every slot serves the operator: closed
                return
            if len(self._counted) >= MAX_CONNECTIONS:
                self._drop(min(self._pending, key=self._pending.__getitem__))
            self._counted.add(request)
            self._pending[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def identified(self, request: Any) -> None:
        """The request named this pod's uid: no longer subject to the read deadline."""
        with self._guard:
            self._pending.pop(request, None)

    def reap(self) -> None:
        while True:
            time.sleep(REAP_SECONDS)
            with self._guard:
                late = [r for r, since in self._pending.items()
                        if time.monotonic() - since > READ_SECONDS]
                for request in late:
                    self._drop(request)

    def _drop(self, request: Any) -> None:
        """Ends a connection's reads (its thread then finishes) and frees its slot now."""
        self._pending.pop(request, None)
        self._counted.discard(request)
        with contextlib.suppress(OSError):  # already closed
            request.shutdown(socket.SHUT_RDWR)

    def _release(self, request: Any) -> None:
        with self._guard:
            self._pending.pop(request, None)
            self._counted.discard(request)

    def server_bind(self) -> None:
        """Bind without HTTPServer's getfqdn(), a DNS lookup that may stall in a pod."""
        if self.address_family == socket.AF_INET6:  # both families on one socket
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "agent", self.server_address[1]


class _Server4(_Server):
    address_family = socket.AF_INET


class _Server6(_Server):
    address_family = socket.AF_INET6


def listen() -> None:
    """Hear the operator on PORT, in the background (no port: the downwardAPI alone)."""
    if not PORT:
        return
    error: OSError | None = None
    for server_class, host in ((_Server6, "::"), (_Server4, "")):
        try:
            server = server_class((host, PORT), _Told)
        except OSError as e:
            error = e
            continue
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return
    # Say so and go on: the downwardAPI still tells, later.
    print(f"cannot listen on port {PORT}: {error}", flush=True)


def publish(value: int | None) -> None:
    """The pod's generation as the agent knows it, for the trainer (MWJ_POD_GENERATION_FILE):
    an old trainer stopped because its pod moved on then exits at once, even before the
    kubelet refreshes the label's file."""
    if value is not None:
        _keep("pod-generation", value)


def opened() -> int | None:
    """The last generation the gate let start in this pod (kept across container restarts)."""
    return _read(os.path.join(STATE, "opened"))


def launcher_handles(generation_now: int, rose_at: float) -> bool:
    """Whether the warm launcher is moving its trainer to `generation_now` itself: it beats,
    and it has stopped the old trainer (held) or is still within LAUNCHER_STOP_SECONDS of the
    rise, seen at `rose_at` (monotonic)."""
    report = launcher_report()
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
    listen()
    at_start = opened()
    rose_at: float | None = None
    while True:
        now, started = generation(), opened()
        publish(now)
        if started is not None and started != at_start and now is not None and now > started:
            rose_at = rose_at if rose_at is not None else time.monotonic()
            if not launcher_handles(now, rose_at):
                print(f"generation {started} -> {now}: restarting the pod's containers",
                      flush=True)
                return RESTART_EXIT
        else:
            rose_at = None
        time.sleep(POLL_SECONDS)


def gate() -> int:
    """Exit 0 once the pod's generation is released and was not opened before."""
    opened_file = os.path.join(STATE, "opened")
    said = False
    while True:
        current, go, last = generation(), released(), opened()
        if current is not None and go == current and (last is None or last < current):
            publish(current)
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
