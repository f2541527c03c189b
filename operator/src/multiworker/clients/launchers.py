"""Follows the warm launchers of worker pods (pod/launcher.py) through their agents'
GET /trainer, a long poll: the launcher's trainer runs inside a container that does not end
with it, so the kubelet never reports its exit; this is how the operator learns of it (and of
an old trainer stopped for a new generation) within a fraction of a second.

What matters to a pass is copied onto the pod (ANNOTATION_LAUNCHER), so passes keep reading
pods alone, a restarted operator finds it there, and `kubectl describe pod` shows it. A pod
whose IP was taken by another pod refuses us (its uid is named); a lost answer is asked again,
and the launcher keeps its report until the next generation, so nothing is missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from multiworker.api import contract, names

log = logging.getLogger(__name__)

WAIT_SECONDS = 15.0  # how long the agent holds a request without news (its cap is 20)
RETRY_SECONDS = 0.5  # after a refused or failed request
REFUSED_SECONDS = 5.0  # after a 404/409: an agent without the endpoint, or another pod
# What a pass acts on: the generation a report is about, and its trainer's state and exit.
KEPT_FIELDS = ("generation", "state", "path", "why", "exit")

Key = tuple[str, str]


@dataclass(frozen=True)
class LauncherTarget:
    """A worker pod whose training container is the warm launcher."""

    namespace: str
    pod: str
    uid: str
    ip: str
    port: int  # its agent's (spec.restartPolicy.agentPort)


def launcher_targets(pods: Iterable[Mapping[str, Any]]) -> list[LauncherTarget]:
    """The pods to follow: running the launcher as created, with an IP, not being deleted."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ip = (pod.get("status") or {}).get("podIP")
        port = str((meta.get("annotations") or {}).get(names.ANNOTATION_WARM_AGENT_PORT, ""))
        if ip and port.isdigit() and meta.get("uid") and "deletionTimestamp" not in meta:
            found.append(LauncherTarget(meta.get("namespace", ""), meta.get("name", ""),
                                        meta["uid"], ip, int(port)))
    return found


def kept(report: Mapping[str, Any]) -> str:
    """The part of a report a pass reads, as the pod's annotation holds it ("" for none)."""
    if not report.get("state"):
        return ""
    return json.dumps({k: report.get(k) for k in KEPT_FIELDS}, sort_keys=True,
                      separators=(",", ":"))


def trainer_url(target: LauncherTarget) -> str:
    host = f"[{target.ip}]" if ":" in target.ip else target.ip  # IPv6 pod IPs
    return f"http://{host}:{target.port}{contract.AGENT_TRAINER_PATH}"


class Launchers:
    """One long poll per followed pod, from the operator's event loop; `on_report` gets each
    report whose kept part changed (and decides whether the pod needs writing)."""

    def __init__(self, on_report: Callable[[LauncherTarget, str], Awaitable[None]]) -> None:
        self._on_report = on_report
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[Key, dict[LauncherTarget, asyncio.Task[None]]] = {}

    def __len__(self) -> int:
        """Jobs whose launchers are followed now."""
        return len(self._tasks)

    def follow(self, key: Key, targets: Iterable[LauncherTarget]) -> None:
        """Follow exactly `targets` for the job `key` (call from the event loop)."""
        wanted, running = set(targets), self._tasks.setdefault(key, {})
        for target in [t for t in running if t not in wanted]:
            running.pop(target).cancel()
        if wanted and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=WAIT_SECONDS + 5))
        for target in wanted - set(running):
            running[target] = asyncio.create_task(self._follow(target),
                                                  name=f"follow launcher {target.pod}")
        if not running:
            self._tasks.pop(key, None)

    def forget(self, key: Key) -> None:
        for task in self._tasks.pop(key, {}).values():
            task.cancel()

    async def close(self) -> None:
        for key in list(self._tasks):
            self.forget(key)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _follow(self, target: LauncherTarget) -> None:
        version: object = None
        last = None
        while True:
            assert self._session is not None
            params = {"uid": target.uid, "wait": f"{WAIT_SECONDS:g}"}
            if version is not None:
                params["version"] = str(version)
            pause = 0.0
            try:
                async with self._session.get(trainer_url(target), params=params,
                                             allow_redirects=False) as response:
                    if response.status == 200:
                        report = await response.json(content_type=None)
                        version = report.get("version") if isinstance(report, dict) else None
                        now = kept(report) if isinstance(report, dict) else ""
                        if now and now != last:
                            await self._on_report(target, now)
                            last = now
                    else:
                        pause = REFUSED_SECONDS
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                log.debug("GET %s: %s", trainer_url(target), type(e).__name__)
                pause = RETRY_SECONDS
            except Exception:  # the write failed: ask again at once, and hand it on again
                log.exception("following the launcher of pod %s/%s", target.namespace,
                              target.pod)
                version, pause = None, RETRY_SECONDS
            if pause:
                await asyncio.sleep(pause)
