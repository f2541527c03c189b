"""Reaching the cluster: the kubeconfig (or the pod's service account), the namespace to work
in, and what the API's errors mean in words.

Every call the client makes runs inside `translated(...)`, so a caller sees a `ClientError`
with the server's own message (or why the server could not be reached), never urllib3's
retry traceback. The message functions are pure and table-tested.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from multiworker.api import names
from multiworker.client.errors import (
    ApiError,
    ClientError,
    ClusterUnreachable,
    InvalidJob,
    JobNotFound,
)

DEFAULT_KUBECONFIG = "~/.kube/config"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# (connect, read) seconds for a plain call: a server that does not answer is an error in
# seconds, not a hung notebook cell. Watches and log streams set their own.
REQUEST_TIMEOUT = (10.0, 60.0)
# Connection errors are tried again twice; a request that reached the server never is (a
# create sent twice would answer 409 to our own first try).
RETRIES = Retry(total=2, read=0, status=0, redirect=0)
# Connections kept for reuse: a log follow holds one per worker and one for the pods' watch
# (more are opened as needed, then closed instead of kept).
POOL_SIZE = 64
# Codes that mean the request's content was refused: the job as written, not the cluster.
REFUSED_CONTENT = frozenset({400, 409, 422})


@dataclass(frozen=True)
class Connection:
    """The APIs of one cluster, and the namespace the client works in."""

    api: client.ApiClient
    namespace: str
    host: str

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def kubeconfig_path(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The kubeconfig to read: the one named, else $KUBECONFIG (one or more paths), else
    ~/.kube/config when it exists; None: there is none (use the pod's service account)."""
    if explicit:
        return explicit
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    return default if os.path.exists(default) else None


def connect(namespace: str | None = None, context: str | None = None,
            kubeconfig: str | None = None) -> Connection:
    """A connection from the kubeconfig (or, with none, the pod's service account); the
    namespace defaults to the context's, else `default`."""
    path = kubeconfig_path(kubeconfig, os.environ)
    configuration = client.Configuration()
    try:
        if path is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ClusterUnreachable(
                f"no kubeconfig: KUBECONFIG is unset, {DEFAULT_KUBECONFIG} does not exist and "
                "this is not a pod; set KUBECONFIG or pass --kubeconfig")
        if path is None:
            config.load_incluster_config(
                client_configuration=configuration)
            found = _service_account_namespace()
        else:
            for one in path.split(os.pathsep):
                if one and not os.path.exists(os.path.expanduser(one)):
                    raise ClusterUnreachable(f"kubeconfig {one} does not exist: set KUBECONFIG "
                                             "or pass --kubeconfig")
            config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration)
            found = _context_namespace(path, context)
    except config.ConfigException as e:
        where = f"kubeconfig {path}" if path else "no kubeconfig, and not in a pod:"
        raise ClusterUnreachable(f"{where} {one_line(str(e))}; set KUBECONFIG, or pass "
                                 "--kubeconfig or --context") from e
    configuration.retries = RETRIES
    configuration.connection_pool_maxsize = POOL_SIZE
    return Connection(client.ApiClient(configuration), namespace or found or "default",
                      configuration.host)


def _context_namespace(path: str, context: str | None) -> str | None:
    contexts, current = config.list_kube_config_contexts(
        config_file=path)
    chosen = next((c for c in contexts if c.get("name") == context), None) if context \
        else current
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


def _service_account_namespace() -> str | None:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def one_line(text: str) -> str:
    return " ".join(text.split())


def server_message(body: str | bytes | None) -> str:
    """The API server's own words from an error body: a Status object's message, else the
    body as text (a missing API answers `404 page not found`)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return one_line(body)
    if isinstance(status, dict) and status.get("message"):
        return one_line(str(status["message"]))
    return one_line(body)


def not_found_kind(body: str | bytes | None) -> str | None:
    """The kind of object a 404 says is missing (`multiworkerjobs`, `pods`, ...), or None when
    the path itself is unknown: the API is not installed."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        details = json.loads(body or "").get("details") or {}
    except (ValueError, AttributeError):
        return None
    kind = details.get("kind")
    return str(kind) if kind else None


def api_error(status: int | None, body: str | bytes | None, what: str) -> ClientError:
    """The error for an API answer `status` to `what` (e.g. `create job default/x`)."""
    said = server_message(body) or f"HTTP {status}"
    if status in REFUSED_CONTENT:
        return InvalidJob(said)
    if status == 404:
        if not_found_kind(body) is None:
            return ApiError(f"{what}: the {names.KIND} API ({names.CRD_NAME}) is not installed "
                            "in this cluster: install the operator's chart or its CRD", status)
        return JobNotFound(said)
    if status == 401:
        return ApiError(f"{what}: unauthorized ({said}): your credentials were refused; "
                        "log in again or check the kubeconfig's user", status)
    if status == 403:
        return ApiError(f"{what}: forbidden: {said}", status)
    return ApiError(f"{what}: {status} {said}", status)


def unreachable_message(host: str, error: Exception) -> str:
    """Why `host` could not be reached, in a few words, and what to check."""
    reason = getattr(error, "reason", None) or error
    text = str(reason)
    if "Connection refused" in text:
        why = "connection refused"
    elif isinstance(reason, urllib3.exceptions.ConnectTimeoutError) or "timed out" in text:
        why = "timed out"
    elif isinstance(reason, urllib3.exceptions.SSLError):
        why = f"TLS error: {one_line(text)}"
    elif "Name or service not known" in text or "nodename nor servname" in text:
        why = "unknown host name"
    else:
        why = one_line(text.split("):", 1)[-1] if "):" in text else text)
    return (f"cannot reach the cluster at {host} ({why}): is it running, and do KUBECONFIG, "
            "--kubeconfig or --context point at it?")


@contextmanager
def translated(connection: Connection, what: str,
               not_found: Callable[[], ClientError] | None = None) -> Iterator[None]:
    """Run an API call, turning what can go wrong into a ClientError that names `what`;
    `not_found` makes the error for a 404 of a known kind (the job named is not there)."""
    try:
        yield
    except ApiException as e:
        error = api_error(e.status, e.body, what)
        if isinstance(error, JobNotFound) and not_found is not None:
            error = not_found()
        raise error from e
    except urllib3.exceptions.HTTPError as e:
        raise ClusterUnreachable(unreachable_message(connection.host, e)) from e


def raw(response: Any) -> dict[str, Any]:
    """The JSON object of an answer read with _preload_content=False (the client's own models
    would turn times into datetimes and drop fields they do not know)."""
    return as_dict(json.loads(response.data))


def as_dict(value: object) -> dict[str, Any]:
    """A custom object as the API returned it (the client types it `object`)."""
    if not isinstance(value, dict):
        raise ApiError(f"the API server answered {type(value).__name__}, not an object")
    return value
