"""Tells the in-place restart agents of worker pods (runtime/agent.py) of a new generation
at once: the same word their pod's labels carry, without waiting for the kubelet to refresh
its downwardAPI volume (which once in a dozen restarts took over 30 s).

A note is a hint, never the only channel: one that is lost (the agent restarting, a
NetworkPolicy, an operator that dies mid-way) leaves the labels to tell, later. So each note
is tried a few times within a couple of seconds and then dropped, and nothing waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from multiworker.api.contract import AGENT_NOTE_PATH

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 1.0
TRIES = 3
RETRY_SECONDS = 0.3


@dataclass(frozen=True)
class AgentNote:
    """What a pod's in-place restart agent is told at once (its labels tell it later):
    the pod's generation and the one released to start (runtime/agent.py)."""

    ip: str
    port: int
    uid: str  # only this pod: an IP reused by another pod refuses the note
    generation: int
    released: int | None = None


def note_url(note: AgentNote) -> str:
    host = f"[{note.ip}]" if ":" in note.ip else note.ip  # IPv6 pod IPs
    return f"http://{host}:{note.port}{AGENT_NOTE_PATH}"


def note_body(note: AgentNote) -> dict[str, object]:
    return {"uid": note.uid, "generation": note.generation, "released": note.released}


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
                    if response.status < 500:  # 204 heard; 409 another pod: either way done
                        log.debug("PUT %s: %s", url, response.status)
                        return
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.debug("PUT %s: %s", url, type(e).__name__)
            if attempt + 1 < TRIES:
                await asyncio.sleep(RETRY_SECONDS)
