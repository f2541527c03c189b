"""I/O: fetch GET /progress from every worker at once (docs/contracts.md), with short timeouts.

A worker that does not answer in time, refuses the connection or sends something that is not
JSON yields None: to the hang rule that is simply a worker that did not advance.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

PATH = "/progress"
TIMEOUT_SECONDS = 2.0
_MAX_BODY = 64 * 1024  # a report is a few hundred bytes


def progress_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip  # IPv6 pod IPs
    return f"http://{host}:{port}{PATH}"


async def fetch_reports(
    workers: Sequence[tuple[int, str]], port: int, timeout: float = TIMEOUT_SECONDS
) -> dict[int, Any]:
    """The decoded JSON body of each worker's report by index; None where it failed."""
    limits = aiohttp.ClientTimeout(total=timeout)
    # A fresh connection per poll: a worker that stopped answering must not hide behind a pool.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(timeout=limits, connector=connector) as session:
        bodies = await asyncio.gather(*(_fetch(session, progress_url(ip, port))
                                        for _, ip in workers))
    return {index: body for (index, _), body in zip(workers, bodies, strict=True)}


async def _fetch(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                log.debug("GET %s: HTTP %s", url, response.status)
                return None
            if (response.content_length or 0) > _MAX_BODY:
                return None
            return json.loads(await response.read())
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:
        log.debug("GET %s: %s", url, type(e).__name__)
        return None
