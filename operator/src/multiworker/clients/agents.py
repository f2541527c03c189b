"""Tells the in-place restart agents of worker pods (pod/agent.py) of a new generation
at once: the same word their pod's labels carry, without waiting for the kubelet to refresh
its downwardAPI volume (which once in a dozen restarts took over 30 s).

A note is a hint, never the only channel: one that is lost (the agent restarting, a
NetworkPolicy, an operator that dies mid-way) leaves the labels to tell, later. So each note
is tried a few times within a couple of seconds and then dropped, and nothing waits for it.

Every note is signed with the job's key (reconcile/agent_keys.py: a Secret mounted into the
agent alone), over what it says and an expiry: anyone who can list pods can name a pod's uid,
and an unsigned note would let them move it to a generation the operator never released.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from multiworker.api.contract import AGENT_NOTE_PATH

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 1.0
TRIES = 3
RETRY_SECONDS = 0.3
# How long a signed note holds: it bounds a replayed note (which can only repeat what the
# operator said, and values only rise), and is far above any clock difference between the
# operator and a node; a node clock further off loses only the fast word (the labels tell).
NOTE_LIFETIME_SECONDS = 120


@dataclass(frozen=True)
class AgentNote:
    """What a pod's in-place restart agent is told at once (its labels tell it later):
    the pod's generation and the one released to start (pod/agent.py)."""

    ip: str
    port: int
    uid: str  # only this pod: an IP reused by another pod refuses the note
    generation: int
    released: int | None = None
    key: bytes | None = field(default=None, repr=False, compare=False)  # the job's signing key


def signed(notes: Sequence[AgentNote], key: bytes | None) -> list[AgentNote]:
    return [replace(note, key=key) for note in notes]


def signature(key: bytes, path: str, uid: str, generation: int | None, released: int | None,
              expires: int) -> str:
    """HMAC-SHA256 of what a request says (pod/notes.py checks the same message)."""
    message = json.dumps([path, uid, generation, released, expires], separators=(",", ":"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def note_url(note: AgentNote) -> str:
    host = f"[{note.ip}]" if ":" in note.ip else note.ip  # IPv6 pod IPs
    return f"http://{host}:{note.port}{AGENT_NOTE_PATH}"


def note_body(note: AgentNote, now: float | None = None) -> dict[str, object]:
    """What the PUT carries: signed where the note has its job's key (an agent shipped
    before notes were signed ignores the extra fields)."""
    body: dict[str, object] = {"uid": note.uid, "generation": note.generation,
                               "released": note.released}
    if note.key is not None:
        expires = int(time.time() if now is None else now) + NOTE_LIFETIME_SECONDS
        body["expires"] = expires
        body["signature"] = signature(note.key, AGENT_NOTE_PATH, note.uid, note.generation,
                                      note.released, expires)
    return body


class Agents:
    """Sends notes from the operator's event loop; owns one HTTP session."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def tell(self, notes: Sequence[AgentNote]) -> None:
        """Send `notes` in the background (call from the event loop)."""
        if not notes:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS))
        for note in notes:
            task = asyncio.create_task(self._send(self._session, note),
                                       name=f"tell agent {note.ip}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    async def _send(session: aiohttp.ClientSession, note: AgentNote) -> None:
        url = note_url(note)
        for attempt in range(TRIES):
            try:
                async with session.put(url, json=note_body(note),
                                       allow_redirects=False) as response:
                    # 204 heard; 409 another pod, 401/403 refused: either way done
                    if response.status == 401:  # a key or a clock that does not match
                        log.warning("the agent at %s refused a signed note: %s", url,
                                    (await response.text())[:200])
                    if response.status < 500:
                        log.debug("PUT %s: %s", url, response.status)
                        return
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.debug("PUT %s: %s", url, type(e).__name__)
            if attempt + 1 < TRIES:
                await asyncio.sleep(RETRY_SECONDS)
