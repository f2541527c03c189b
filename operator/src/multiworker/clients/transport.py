"""One REST call to the API server, the way every call is made: rate-limited by a token bucket
shared by all threads, with (connect, read) timeouts, its status checked, and counted in
`multiworker_api_requests_total` by RBAC verb and resource. Also the batches of a group's pod
creates, deletes and patches, and the list/watch calls the informers make.

Plain REST with JSON bodies: the client's typed models would re-validate our manifests (and
refuse valid ones, e.g. an integer GPU quantity). The kubernetes client configures the
credentials (refreshed tokens included) and the urllib3 pool that single calls and watches use
from their own thread, each body encoded once: the client's own request path nearly doubled the
CPU of each call (0.9 ms against 0.5 ms for a pod's create, measured here). A batch goes out from
one asyncio loop of its own through aiohttp, whose HTTP parser is compiled: 0.2 ms of CPU a call
against 0.55 ms from a pool of threads (measured here, 2,000 GETs), and 1-2 calls per pod. That
loop, and kopf's (cli.py), is uvloop's, whose TLS transport is compiled too: a batch of 300
merge-patches cost 0.77 ms of CPU a call against 1.04 ms on asyncio's own loop, and the operator's
CPU per pod created fell by a fifth to a quarter (bench_scale.py, 8 to 256 workers).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec
import urllib3
import uvloop
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse
from pydantic_core import from_json
from urllib3.util.retry import Retry

from multiworker.clients import metrics

Manifest = dict[str, Any]
WATCH_READ_TIMEOUT_SECONDS = 90.0
CONNECT_TRIES = 4  # a refused or failed connection, not a call the server may have done


@dataclass(frozen=True)
class Call:
    """One call of a batch (Transport.send_all)."""

    method: str
    path: str
    body: Manifest | None = None
    content_type: str = "application/json"


class Expired(Exception):
    """410 Gone on a watch: the resource version is too old; list again."""


@dataclass(frozen=True)
class ClientSettings:
    """Client-side limits that protect the API server (flags and chart values)."""

    # Sustained requests per second. A runaway loop is the server's to throttle (API Priority
    # and Fairness); this bound keeps one operator from taking all of it. At 100 it set the
    # pace of large groups (a 1,024-worker restart is ~2,050 calls: 15 s of tokens after the
    # burst; 1,000 jobs x 8 some 13,000 calls) and throttled calls cost ~3x the CPU each (a
    # batch goes out one call per wake-up). JobSet's default is 500 too.
    qps: float = 500.0
    burst: int = 1000  # at once after a quiet period: a whole 512-worker group restart
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
        self.pool_size = max(64, self.settings.concurrency * 2)
        self._session: aiohttp.ClientSession | None = None
        self._loop = uvloop.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="api", daemon=True).start()

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
        decode: Callable[[bytes], Manifest] = from_json,
        read_timeout: float = WATCH_READ_TIMEOUT_SECONDS,
    ) -> Iterator[Manifest]:
        """Watch events (dicts with `type` and `object`, each line `decode`d: shapes.py) from
        `resource_version`, with bookmarks, until the server ends the stream. A connection
        silent for `read_timeout` (longer than the API server's bookmark interval, about a
        minute) raises: it is dead."""
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
                events.inc(len(lines))  # one lock per chunk, not per event
                for line in lines:
                    if not line.strip():
                        continue
                    event = decode(line)
                    if event.get("type") == "ERROR":
                        error = event.get("object") or {}
                        if error.get("code") == 410:
                            raise Expired(str(error.get("message", "")))
                        raise ApiException(status=error.get("code"), reason=error.get("message"))
                    yield event
        finally:
            response.release_conn()

    # --- calls ---

    def send_all(self, calls: Sequence[Call]) -> list[ApiException | None]:
        """Calls whose answers are not needed (a group's pods created or deleted), at most
        `concurrency` at a time, sent from the API loop as one batch: per call None (done) or
        the error status the server answered. Any other error (a timeout, a dropped
        connection) raises once every call has ended, so no call outlives the pass."""
        if not calls:
            return []
        batch = self._send_all(calls)
        return asyncio.run_coroutine_threadsafe(batch, self._loop).result()

    async def _send_all(self, calls: Sequence[Call]) -> list[ApiException | None]:
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def send(call: Call) -> ApiException | None:
            async with gate:
                delay = self.limiter.reserve()
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    await self._send(call)
                except ApiException as e:
                    return e
                return None

        results = await asyncio.gather(*(send(c) for c in calls), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ApiException):
                raise result
        return [r if isinstance(r, ApiException) else None for r in results]

    def request(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
        verb: str | None = None, read_timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """One call from the caller's thread, through the client's urllib3 pool, with (connect,
        read) timeouts; the raw response (body unread), status checked: an error status raises
        ApiException with the server's answer."""
        url, headers, data = self._prepare(method, path, body, query, content_type)
        timeout = read_timeout or self.settings.timeout_seconds
        code = "error"
        try:
            response = self.api.rest_client.pool_manager.request(
                method, url, headers=headers, preload_content=False,
                body=data,
                timeout=urllib3.Timeout(connect=min(timeout, 10), read=timeout))
            code = str(response.status)
            if not 200 <= response.status < 300:
                answer = RESTResponse(response)
                answer.read()
                response.release_conn()
                raise ApiException(http_resp=answer)
            return response
        finally:
            _count(method, path, verb, code)

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
        """One call whose answer is not needed (a Service created, an Event): the body is
        read off the connection but not decoded."""
        self.limiter.acquire()
        response = self.request(method, path, body, None, content_type)
        response.drain_conn()
        response.release_conn()

    def close(self) -> None:
        """Close the batches' connections and stop the API loop (tests; the operator exits
        instead)."""
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _send(self, call: Call) -> None:
        """One call of a batch, from the API loop; its answer read off the connection, not
        decoded (at 1,024 pods that is 1,024 pods' JSON)."""
        method, path = call.method, call.path
        url, headers, data = self._prepare(method, path, call.body, None, call.content_type)
        config = self.api.configuration
        seconds = self.settings.timeout_seconds
        limits = aiohttp.ClientTimeout(sock_connect=min(seconds, 10), sock_read=seconds)
        session = await self._connected()
        code = "error"
        try:
            for attempt in range(1, CONNECT_TRIES + 1):
                try:
                    async with session.request(
                        method, url, headers=headers, data=data, timeout=limits,
                        proxy=config.proxy or None,
                        server_hostname=getattr(config, "tls_server_name", None) or None,
                    ) as response:
                        code = str(response.status)
                        answer = await response.read()
                        if not 200 <= response.status < 300:
                            error = ApiException(status=response.status, reason=response.reason,
                                                 body=answer.decode(errors="replace"))
                            error.headers = response.headers
                            raise error
                        return
                except aiohttp.ClientConnectorError:
                    # Nothing was sent: trying again cannot do the call twice.
                    if attempt == CONNECT_TRIES:
                        raise
            raise AssertionError("unreachable")
        finally:
            _count(method, path, None, code)

    def _prepare(
        self, method: str, path: str, body: Manifest | None,
        query: list[tuple[str, str]] | None, content_type: str,
    ) -> tuple[str, dict[str, str], bytes | None]:
        """URL, headers and encoded body of one call, for either HTTP stack."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The credentials as the client holds them now (a rotated token is re-read there).
        self.api.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        url = self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        # msgspec: the same bytes as json.dumps(separators=(",", ":")), a tenth of the CPU
        # (1.7 us against 17 us for a pod).
        data = None if body is None else msgspec.json.encode(body)
        return url, headers, data

    async def _connected(self) -> aiohttp.ClientSession:
        """The API loop's one session: a pool of keep-alive connections to the API server."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=self.pool_size, ssl=ssl_context(self.api.configuration)))
        return self._session


def ssl_context(config: client.Configuration) -> ssl.SSLContext | bool:
    """TLS as the kubernetes client's configuration asks: its CA, client certificate, and
    whether to verify the server (False: plain HTTP, no TLS to set up)."""
    if not config.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif config.assert_hostname is False:
        context.check_hostname = False
    return context


def _count(method: str, path: str, verb: str | None, code: str) -> None:
    group, resource, collection = _resource(path)
    metrics.API_REQUESTS.labels(
        verb=verb or _rbac_verb(method, collection),
        resource=f"{group}/{resource}" if group else resource, code=code).inc()


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
            "PATCH": "patch", "DELETE": "deletecollection" if collection else "delete",
            }.get(method, method.lower())
