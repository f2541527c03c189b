"""One REST call to the API server, the way every call is made: rate-limited by a token bucket
shared by all threads, with (connect, read) timeouts, its status checked, and counted in
`multiworker_api_requests_total` by RBAC verb and resource. Also the parallel fan-out of
pod creates and deletes, and the list/watch calls the informers make.

Plain REST with JSON bodies: the client's typed models would re-validate our manifests (and
refuse valid ones, e.g. an integer GPU quantity). The kubernetes client configures the
connection pool (TLS, proxy) and the credentials (refreshed tokens included); each request goes
straight to that urllib3 pool with its body encoded once: the client's own request path (a
walk that rebuilds the body, its encoding, per-call option parsing) nearly doubled the CPU of
each call (0.9 ms against 0.5 ms for a pod's create, measured here), at 1-2 calls per pod.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse
from pydantic_core import from_json
from urllib3.util.retry import Retry

from multiworker.clients import metrics

Manifest = dict[str, Any]
T = TypeVar("T")
WATCH_READ_TIMEOUT_SECONDS = 90.0


class Expired(Exception):
    """410 Gone on a watch: the resource version is too old; list again."""


@dataclass(frozen=True)
class ClientSettings:
    """Client-side limits that protect the API server (flags and chart values)."""

    qps: float = 100.0  # sustained requests per second: a runaway loop stays harmless
    burst: int = 500  # at once after a quiet period: a whole 256-worker group restart
    timeout_seconds: float = 30.0  # every call (a watch: its read timeout between lines)
    concurrency: int = 32  # parallel pod creates/deletes of one operator


class RateLimiter:
    """A token bucket shared by every thread: `qps` tokens a second, at most `burst` saved."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.qps, self.burst, self.clock = qps, max(burst, 1), clock
        self._tokens = float(self.burst)
        self._at = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (0 when one was saved)."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            time.sleep(delay)


def new_api_client(pool_size: int = 64) -> client.ApiClient:
    """An API client from $KUBECONFIG (or ~/.kube/config), else the in-cluster service
    account."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    # A call that timed out reading is not sent again by urllib3: the server may have done it,
    # and three silent retries would make every timeout four (a 3 s Lease renewal 12 s, past the
    # leader's deadline). Connection errors are still retried; the caller retries the rest.
    configuration.retries = Retry(total=3, read=0, status=0, redirect=0)
    return client.ApiClient(configuration)


class Transport:
    """Calls to one API server under ClientSettings."""

    def __init__(self, api: client.ApiClient, settings: ClientSettings | None = None) -> None:
        self.api = api
        self.settings = settings or ClientSettings()
        self.limiter = RateLimiter(self.settings.qps, self.settings.burst)
        self.fanout = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="api")

    # --- lists and watches (informer.py) ---

    def list_page(
        self, path: str, selector: str | None, limit: int, cont: str | None
    ) -> Manifest:
        query = [("limit", str(limit))]
        if selector:
            query.append(("labelSelector", selector))
        if cont:
            query.append(("continue", cont))
        return self.call("GET", path, query=query)

    def watch(
        self, path: str, selector: str | None, resource_version: str, server_timeout: int,
        read_timeout: float = WATCH_READ_TIMEOUT_SECONDS,
    ) -> Iterator[Manifest]:
        """Watch events (dicts with `type` and `object`) from `resource_version`, with
        bookmarks, until the server ends the stream. A connection silent for `read_timeout`
        (longer than the API server's bookmark interval, about a minute) raises: it is dead."""
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(server_timeout))]
        if selector:
            query.append(("labelSelector", selector))
        self.limiter.acquire()
        response = self.request("GET", path, query=query, verb="watch",
                                read_timeout=read_timeout)
        group, resource, _ = _resource(path)
        label = f"{group}/{resource}" if group else resource
        received, events = metrics.WATCH_BYTES.labels(label), metrics.WATCH_EVENTS.labels(label)
        try:
            buffer = b""
            for chunk in response.stream(64 * 1024, decode_content=True):
                received.inc(len(chunk))
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    events.inc()
                    event: Manifest = from_json(line)
                    if event.get("type") == "ERROR":
                        error = event.get("object") or {}
                        if error.get("code") == 410:
                            raise Expired(str(error.get("message", "")))
                        raise ApiException(status=error.get("code"), reason=error.get("message"))
                    yield event
        finally:
            response.release_conn()

    # --- calls ---

    def parallel(self, call: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
        if len(items) <= 1:
            return [call(item) for item in items]
        futures = [self.fanout.submit(call, item) for item in items]
        results, error = [], None
        for future in futures:  # wait for all, so no call outlives the pass
            try:
                results.append(future.result())
            except Exception as e:  # noqa: BLE001 (re-raised below, after the others)
                error = error or e
        if error is not None:
            raise error
        return results

    def request(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
        verb: str | None = None, read_timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """One call, with (connect, read) timeouts; the raw response (body unread), status
        checked: an error status raises ApiException with the server's answer."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The credentials as the client holds them now (a rotated token is re-read there).
        self.api.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        url = self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        timeout = read_timeout or self.settings.timeout_seconds
        code = "error"
        try:
            response = self.api.rest_client.pool_manager.request(
                method, url, headers=headers, preload_content=False,
                body=None if body is None else json.dumps(body, separators=(",", ":")),
                timeout=urllib3.Timeout(connect=min(timeout, 10), read=timeout))
            code = str(response.status)
            if not 200 <= response.status < 300:
                answer = RESTResponse(response)
                answer.read()
                response.release_conn()
                raise ApiException(http_resp=answer)
            return response
        finally:
            group, resource, collection = _resource(path)
            metrics.API_REQUESTS.labels(
                verb=verb or _rbac_verb(method, collection),
                resource=f"{group}/{resource}" if group else resource, code=code).inc()

    def call(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Manifest:
        """One call; the object the server answered. `timeout` (seconds) replaces
        --request-timeout for calls that must give up sooner (a Lease renewal, which is
        worthless after the leader's deadline)."""
        self.limiter.acquire()
        response = self.request(method, path, body, query, content_type, read_timeout=timeout)
        try:
            data = response.data
        finally:
            response.release_conn()
        found: Manifest = from_json(data) if data else {}
        return found

    def send(self, method: str, path: str, body: Manifest | None = None,
             content_type: str = "application/json") -> None:
        """One call whose answer is not needed (a pod created, deleted or labelled): the body
        is read off the connection but not decoded — at 1,024 pods that is 1,024 pods' JSON."""
        self.limiter.acquire()
        response = self.request(method, path, body, None, content_type)
        response.drain_conn()
        response.release_conn()


def _resource(path: str) -> tuple[str, str, bool]:
    """(API group, resource[/subresource], whether it names a collection) of a REST path."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    group = parts[1] if parts and parts[0] == "apis" else ""
    rest = parts[3:] if parts and parts[0] == "apis" else parts[2:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return group, "?", True
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    return group, resource, len(rest) == 1


def _rbac_verb(method: str, collection: bool) -> str:
    return {"GET": "list" if collection else "get", "POST": "create", "PUT": "update",
            "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
