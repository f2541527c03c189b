"""All API I/O, through the (synchronous) kubernetes client: every call rate-limited, timed out
and counted. Callers run it in threads; pod creates and deletes fan out in parallel.

Objects travel as plain camelCase dicts, exactly as the API returns them, so the pure layers
(observe, render) never see client model classes.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from multiworker import metrics, names
from multiworker.schema import format_time

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
COMPONENT = "multiworker-operator"
EVENT_MESSAGE_LIMIT = 1024
WATCH_READ_TIMEOUT_SECONDS = 90.0
T = TypeVar("T")


# Every (API group, resource, verb) the operator calls — the chart's RBAC grants exactly these
# (tests/unit/test_chart.py compares them; the e2e suite checks the calls made stay inside).
# multiworkerjobs/finalizers: update is what blockOwnerDeletion on owned objects requires.
FOOTPRINT: dict[tuple[str, str], frozenset[str]] = {
    (names.GROUP, names.PLURAL): frozenset({"list", "watch", "delete"}),
    (names.GROUP, f"{names.PLURAL}/status"): frozenset({"patch"}),
    (names.GROUP, f"{names.PLURAL}/finalizers"): frozenset({"update"}),
    ("", "pods"): frozenset({"get", "list", "watch", "create", "delete"}),
    ("", "services"): frozenset({"get", "create"}),
    ("", "events"): frozenset({"create"}),
    ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update"}),
    ("", "nodes"): frozenset({"list", "watch"}),
}


class Created(StrEnum):
    CREATED = "Created"
    EXISTS = "Exists"  # 409: it was there already; the caller checks who controls it


class RefusalKind(StrEnum):
    """Why the API server refused to create an object — each calls for a different answer."""

    INVALID = "Invalid"  # 400/422: the object itself is wrong; retrying cannot help
    FORBIDDEN = "Forbidden"  # 403: admission (PodSecurity, a webhook, LimitRange) said no
    QUOTA = "QuotaExceeded"  # 403 from ResourceQuota: may pass once other pods finish


class Refused(Exception):
    """The API server refused to create an object; `message` is the server's own words."""

    def __init__(self, kind: RefusalKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Conflict(Exception):
    """The object changed since we read it (optimistic concurrency): read again."""


class Gone(Exception):
    """The object no longer exists (404 on an update)."""


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
    return client.ApiClient(configuration)


def _server_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


def refusal_kind(status: int, message: str) -> RefusalKind | None:
    """Which refusal a failed create is (None: not a refusal, e.g. 500 or a timeout)."""
    if status in (400, 422):
        return RefusalKind.INVALID
    if status == 403:
        return RefusalKind.QUOTA if "exceeded quota" in message else RefusalKind.FORBIDDEN
    return None


@dataclass(frozen=True)
class PodDeletion:
    namespace: str
    name: str
    uid: str  # only this pod, never a newer one of the same name
    grace: int | None = None  # None: the pod's own terminationGracePeriodSeconds


class Cluster:
    """The operator's writes and its informers' lists and watches.

    Plain REST calls with JSON bodies: the client's typed models would re-validate our
    manifests (and refuse valid ones, e.g. an integer GPU quantity).
    """

    def __init__(self, api: client.ApiClient, settings: ClientSettings | None = None,
                 instance: str | None = None) -> None:
        self.api = api
        self.settings = settings or ClientSettings()
        self.limiter = RateLimiter(self.settings.qps, self.settings.burst)
        self.fanout = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="api")
        self.instance = instance or socket.gethostname()  # Events' reportingInstance

    # --- jobs ---

    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> str:
        """Merge-patch the status subresource (null clears a field), only if the job is still
        at `resource_version`: a decision made on an outdated view is never written. Returns
        the job's new resource version."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            found = self._call("PATCH", names.job_path(namespace, name) + "/status", body,
                               content_type="application/merge-patch+json")
        except ApiException as e:
            if e.status == 409:
                raise Conflict(f"{namespace}/{name} changed since it was read") from e
            if e.status == 404:
                raise Gone(f"{namespace}/{name} is gone") from e
            raise
        return str(found.get("metadata", {}).get("resourceVersion", ""))

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job; owner references take its pods and Service with it."""
        options = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        self._delete(names.job_path(namespace, name), options)

    # --- pods and services ---

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_core_path(namespace, "services", name))

    def get_pod(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_core_path(namespace, "pods", name))

    def create_service(self, service: Manifest) -> Created:
        return self._create(_core_path(service["metadata"]["namespace"], "services"), service)

    def create_pods(self, pods: Sequence[Manifest]) -> list[Created | Refused]:
        """Create pods in parallel (bounded by settings.concurrency): per pod, Created or the
        API server's refusal. Other errors (timeouts, 5xx) raise after every call ended."""
        def create(pod: Manifest) -> Created | Refused:
            try:
                return self._create(_core_path(pod["metadata"]["namespace"], "pods"), pod)
            except Refused as e:
                return e
        return self._parallel(create, pods)

    def delete_pods(self, deletions: Sequence[PodDeletion]) -> None:
        """Delete pods in parallel, each by uid; already gone is success."""
        def delete(d: PodDeletion) -> None:
            options: Manifest = {"preconditions": {"uid": d.uid}}
            if d.grace is not None:
                options["gracePeriodSeconds"] = d.grace
            self._delete(_core_path(d.namespace, "pods", d.name), options)
        self._parallel(delete, deletions)

    def create_object(self, path: str, manifest: Manifest) -> Created:
        """Create any namespaced object at its collection `path` (PodGroups, say)."""
        return self._create(path, manifest)

    def get_object(self, path: str) -> Manifest | None:
        return self._get(path)

    # --- leases (leader election) ---

    def get_lease(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_lease_path(namespace, name))

    def create_lease(self, lease: Manifest) -> Manifest | None:
        """The created Lease; None when another candidate created it first."""
        try:
            return self._call("POST", _lease_path(lease["metadata"]["namespace"]), lease)
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def replace_lease(self, lease: Manifest) -> Manifest | None:
        """PUT with the read resourceVersion: None when someone else wrote it meanwhile."""
        meta = lease["metadata"]
        try:
            return self._call("PUT", _lease_path(meta["namespace"], meta["name"]), lease)
        except ApiException as e:
            if e.status in (404, 409):
                return None
            raise

    # --- events ---

    def emit_event(
        self, job: Manifest, type_: str, reason: str, message: str, now: datetime
    ) -> None:
        """A core/v1 Event on the job (what `kubectl describe mwj` shows)."""
        meta = job["metadata"]
        stamp = format_time(now.replace(microsecond=0))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": names.API_VERSION, "kind": names.KIND, "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": COMPONENT},
            "reportingComponent": f"{names.GROUP}/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call("POST", _core_path(meta["namespace"], "events"), event)

    # --- lists and watches (informer.py) ---

    def list_page(
        self, path: str, selector: str | None, limit: int, cont: str | None
    ) -> Manifest:
        query = [("limit", str(limit))]
        if selector:
            query.append(("labelSelector", selector))
        if cont:
            query.append(("continue", cont))
        return self._call("GET", path, query=query)

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
        response = self._request("GET", path, query=query, verb="watch",
                                 read_timeout=read_timeout).response
        try:
            buffer = b""
            for chunk in response.stream(64 * 1024, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event: Manifest = json.loads(line)
                    if event.get("type") == "ERROR":
                        error = event.get("object") or {}
                        if error.get("code") == 410:
                            raise Expired(str(error.get("message", "")))
                        raise ApiException(status=error.get("code"), reason=error.get("message"))
                    yield event
        finally:
            response.release_conn()

    # --- REST ---

    def _parallel(self, call: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
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

    def _request(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
        verb: str | None = None, read_timeout: float | None = None,
    ) -> Any:
        """One call, with (connect, read) timeouts; the raw response, status checked."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        timeout = self.settings.timeout_seconds
        code = "error"
        try:
            response = self.api.call_api(
                *request, _request_timeout=(min(timeout, 10), read_timeout or timeout))
            code = str(response.status)
            if not 200 <= response.status < 300:
                response.read()
                raise ApiException(http_resp=response)
            return response
        finally:
            group, resource, collection = _resource(path)
            metrics.API_REQUESTS.labels(
                verb=verb or _rbac_verb(method, collection),
                resource=f"{group}/{resource}" if group else resource, code=code).inc()

    def _call(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
    ) -> Manifest:
        self.limiter.acquire()
        response = self._request(method, path, body, query, content_type)
        response.read()
        found: Manifest = json.loads(response.data) if response.data else {}
        return found

    def _get(self, path: str) -> Manifest | None:
        try:
            return self._call("GET", path)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _create(self, path: str, manifest: Manifest) -> Created:
        try:
            self._call("POST", path, manifest)
        except ApiException as e:
            if e.status == 409:
                return Created.EXISTS
            message = _server_message(e)
            kind = refusal_kind(e.status or 0, message)
            if kind is not None:
                raise Refused(kind, message) from e
            raise
        return Created.CREATED

    def _delete(self, path: str, options: Manifest) -> None:
        """404 (already gone) and 409 (uid precondition: a newer object) are success."""
        try:
            self._call("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", **options})
        except ApiException as e:
            if e.status not in (404, 409):
                raise


def _core_path(namespace: str, resource: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path


def _lease_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path


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
