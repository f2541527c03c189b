"""How a peer's port answers, told apart the way a stuck start needs: the name does not resolve
(DNS, the headless Service), the connection is refused (nothing listens yet: usually just
early), or nothing answers at all (packets dropped: a firewall or a NetworkPolicy).

A refused connection comes back at once; a dropped one only times out, so "dropped" is
claimed after DROPPED_AFTER timeouts in a row, about 15 s. Stdlib only.
"""

from __future__ import annotations

import enum
import http.client
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

PROBE_TIMEOUT_SECONDS = 5.0
DROPPED_AFTER = 3
_MAX_REPORT = 64 * 1024  # a peer's /preflight is a few hundred bytes


class Reach(enum.StrEnum):
    """An endpoint's state in `peers` of GET /progress (docs/contracts.md)."""

    UNRESOLVED = "unresolved"
    REFUSED = "refused"
    CONNECTING = "connecting"  # timed out, fewer than DROPPED_AFTER times in a row
    DROPPED = "dropped"
    UNREACHABLE = "unreachable"
    SILENT = "silent"  # accepts connections, answers nothing
    NOT_READY = "not-ready"  # answers, but not yet what this worker waits for
    READY = "ready"


class Unanswered(Exception):
    """A probe that got no (usable) answer; `reach` says how."""

    def __init__(self, reach: Reach, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.reach = reach
        self.detail = detail
        self.status = status  # the HTTP status, when the peer answered with an error


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connected socket to any address of `host`, or Unanswered with the most telling cause
    among its addresses (a drop on any of them, else a refusal, else the OS error)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise Unanswered(Reach.UNRESOLVED, f"name does not resolve ({e})") from e
    failures: list[Unanswered] = []
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except TimeoutError:
            failures.append(Unanswered(Reach.CONNECTING, "no answer"))
        except ConnectionRefusedError:
            failures.append(Unanswered(Reach.REFUSED, "connection refused (not listening yet)"))
        except OSError as e:
            failures.append(Unanswered(Reach.UNREACHABLE, f"unreachable ({e.strerror or e})"))
        else:
            return sock
        sock.close()
    order = (Reach.CONNECTING, Reach.REFUSED, Reach.UNREACHABLE)
    raise min(failures, key=lambda f: order.index(f.reach))


def accepts(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> None:
    """Returns when `host:port` accepts a TCP connection; raises Unanswered otherwise."""
    connect(host, port, timeout).close()


def get_json(host: str, port: int, path: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> Any:
    """GET a small JSON document; raises Unanswered (NOT_READY for an HTTP error status)."""
    sock = connect(host, port, timeout)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    connection.sock = sock
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        body = response.read(_MAX_REPORT + 1)
    except TimeoutError as e:
        raise Unanswered(Reach.SILENT, "accepts connections but does not answer") from e
    except (OSError, http.client.HTTPException) as e:
        raise Unanswered(Reach.NOT_READY, f"no HTTP answer ({type(e).__name__})") from e
    finally:
        connection.close()
    if response.status != 200:
        raise Unanswered(Reach.NOT_READY, f"HTTP {response.status} for {path}", response.status)
    try:
        return json.loads(body[:_MAX_REPORT])
    except ValueError as e:
        raise Unanswered(Reach.NOT_READY, f"{path} is not JSON") from e


@dataclass
class Endpoint:
    """One thing this worker waits for on one peer: its name, or one of its ports."""

    worker: int
    kind: str  # "name", "tensorflow" or "progress"
    host: str
    port: int
    reach: Reach = Reach.CONNECTING
    detail: str = "not probed yet"
    since: float = field(default_factory=time.time)
    _timeouts: int = 0

    @property
    def ready(self) -> bool:
        return self.reach is Reach.READY

    def record(self, reach: Reach, detail: str) -> bool:
        """Keeps the latest outcome; True when it just became DROPPED (worth a warning)."""
        self._timeouts = self._timeouts + 1 if reach is Reach.CONNECTING else 0
        if reach is Reach.CONNECTING and self._timeouts >= DROPPED_AFTER:
            reach = Reach.DROPPED
            detail = (
                f"no answer after {self._timeouts} attempts: packets are dropped, likely a "
                f"firewall or NetworkPolicy blocking port {self.port}"
            )
        elif reach is Reach.CONNECTING:
            detail = f"no answer yet ({self._timeouts} of {DROPPED_AFTER} attempts timed out)"
        became_dropped = reach is Reach.DROPPED and self.reach is not Reach.DROPPED
        if reach is not self.reach:
            self.since = time.time()
        self.reach, self.detail = reach, detail
        return became_dropped

    def describe(self) -> str:
        """'worker-0 (host:2222, TensorFlow port): <detail>'."""
        what = {"tensorflow": ", TensorFlow port", "progress": ", progress port"}.get(self.kind, "")
        return f"worker-{self.worker} ({self.address}{what}): {self.detail}"

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def report(self) -> dict[str, Any]:
        """Its entry in `peers` of GET /progress."""
        return {
            "worker": self.worker,
            "endpoint": self.kind,
            "address": self.address,
            "state": self.reach.value,
            "detail": self.detail,
            "since": round(self.since, 3),
        }
