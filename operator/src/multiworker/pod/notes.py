"""The operator's word to a pod's restart agent, over HTTP on spec.restartPolicy.agentPort
(served by the watch sidecar, agent.py): PUT /generation, a note of the pod's generation and
the one released, signed with the job's key (a Secret this sidecar alone mounts) and naming
this pod's uid — refused unsigned, altered, expired, for another pod, or claiming more than
the operator could have sent; and GET /trainer, the warm launcher's report, a long poll. A few
connections at a time, each with READ_SECONDS in all, so a flood can neither stall nor
exhaust the sidecar nor keep the operator out. Stdlib only; shipped beside agent.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

if TYPE_CHECKING:  # the same files, as the package has them
    from multiworker.pod import state
else:
    try:  # beside this file, first on sys.path as the pods run it (python3 agent.py ...)
        import state
    except ImportError:  # imported from the package (the tests)
        from multiworker.pod import state

PORT = int(os.environ.get("MWJ_AGENT_PORT", "0") or 0)  # 0: hear only the downwardAPI
POD_UID = os.environ.get("MWJ_AGENT_POD_UID", "")
# The job's key (a Secret the operator creates, mounted into this sidecar alone, never the
# trainer's container): a note must carry its signature (clients/agents.py). No key: every
# note is refused, and the labels alone tell.
KEY_FILE = os.environ.get("MWJ_AGENT_KEY_FILE", "")
NOTE_PATH = "/generation"  # api/contract.py's AGENT_NOTE_PATH
TRAINER_PATH = "/trainer"  # api/contract.py's AGENT_TRAINER_PATH
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


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def plausible(note: dict[str, object]) -> bool:
    """Whether the operator could have sent the note (MAX_LEAD), judged by the pod's label."""
    label = state.read_number(os.path.join(state.POD_INFO, "generation"))
    if label is None:
        return False  # nothing to judge it by: the downwardAPI will tell
    told, release = _count(note.get("generation")), _count(note.get("released"))
    if (told is None and note.get("generation") is not None) or \
            (release is None and note.get("released") is not None):
        return False
    if told is not None and told > label + MAX_LEAD:
        return False
    told_before = state.read_number(os.path.join(state.STATE, "told-generation"))
    ceiling = state.higher(label, told, told_before) or 0
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


def _wait_for_news(seen: int | None, wait: float) -> dict[str, Any]:
    """The launcher's report once its version is not `seen`, or as it is after `wait` s."""
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
    while True:
        report = state.launcher_report() or {}
        if report.get("version") != seen or time.monotonic() >= deadline:
            return report
        time.sleep(state.POLL_SECONDS)


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
                state.keep("told-generation", note.get("generation"))
                state.keep("told-released", note.get("released"))
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
