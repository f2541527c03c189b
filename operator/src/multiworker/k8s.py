"""All cluster I/O, through the (synchronous) kubernetes client. Callers run it in a thread.

Objects travel as plain camelCase dicts, exactly as the API returns them, so the pure layers
(observe, render) never see client model classes.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from multiworker import names
from multiworker.schema import format_time

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
COMPONENT = "multiworker-operator"
EVENT_MESSAGE_LIMIT = 1024
PEERING_GROUP = "kopf.dev"


class Created(StrEnum):
    CREATED = "Created"
    EXISTS = "Exists"  # 409: it was there already; the caller checks who controls it


class ClusterIO(Protocol):
    """What a reconcile pass needs from the cluster: Cluster below, a fake in unit tests."""

    def get_job(self, namespace: str, name: str) -> Manifest | None: ...
    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> None: ...
    def delete_job(self, namespace: str, name: str, uid: str) -> None: ...
    def list_pods(self, namespace: str, job: str) -> list[Manifest]: ...
    def get_pod(self, namespace: str, name: str) -> Manifest | None: ...
    def get_service(self, namespace: str, name: str) -> Manifest | None: ...
    def create_pod(self, pod: Manifest) -> Created: ...
    def create_service(self, service: Manifest) -> Created: ...
    def delete_pod(
        self, namespace: str, name: str, uid: str, grace: int | None = None
    ) -> None: ...
    def emit_event(
        self, job: Manifest, type_: str, reason: str, message: str, now: datetime
    ) -> None: ...


class Conflict(Exception):
    """The object changed since we read it (optimistic concurrency): read again."""


class RejectedObject(Exception):
    """The API server refused an object as invalid (400/422); the message is the server's."""


def new_api_client(pool_size: int = 32) -> client.ApiClient:
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


class Cluster:
    """The operator's view of the API server: jobs, their pods and Service, Events.

    Plain REST calls with JSON bodies: the client's typed models would re-validate our
    manifests (and refuse valid ones, e.g. an integer GPU quantity).
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.instance = socket.gethostname()

    # --- jobs ---

    def get_job(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_job_path(namespace, name))

    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> None:
        """Merge-patch the status subresource (null clears a field), only if the job is still
        at `resource_version`: a decision made on an outdated view is never written."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            self._call("PATCH", _job_path(namespace, name) + "/status", body,
                       content_type="application/merge-patch+json")
        except ApiException as e:
            if e.status == 409:
                raise Conflict(f"{namespace}/{name} changed since it was read") from e
            raise

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job; owner references take its pods and Service with it."""
        options = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        self._delete(_job_path(namespace, name), options)

    # --- pods and services ---

    def list_pods(self, namespace: str, job: str) -> list[Manifest]:
        selector = names.label_selector(names.job_selector(job))
        found = self._call("GET", _core_path(namespace, "pods"),
                           query=[("labelSelector", selector)])
        items: list[Manifest] = found["items"]
        return items

    def get_pod(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_core_path(namespace, "pods", name))

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_core_path(namespace, "services", name))

    def create_pod(self, pod: Manifest) -> Created:
        return self._create(_core_path(pod["metadata"]["namespace"], "pods"), pod)

    def create_service(self, service: Manifest) -> Created:
        return self._create(_core_path(service["metadata"]["namespace"], "services"), service)

    def delete_pod(self, namespace: str, name: str, uid: str, grace: int | None = None) -> None:
        """Delete one pod by uid (never a newer pod of the same name); `grace` None keeps the
        pod's own terminationGracePeriodSeconds so workers can checkpoint on SIGTERM."""
        options: Manifest = {"preconditions": {"uid": uid}}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        self._delete(_core_path(namespace, "pods", name), options)

    # --- kopf peering (HA replicas) ---

    def get_peering(self, namespace: str | None, name: str) -> Manifest | None:
        """The KopfPeering in `namespace`, or the ClusterKopfPeering when None."""
        if namespace is None:
            return self._get(f"/apis/{PEERING_GROUP}/v1/clusterkopfpeerings/{name}")
        return self._get(f"/apis/{PEERING_GROUP}/v1/namespaces/{namespace}/kopfpeerings/{name}")

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

    # --- REST ---

    def _call(
        self, method: str, path: str, body: Manifest | None = None,
        query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
    ) -> Manifest:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request)
        response.read()
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
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
            if e.status in (400, 422):
                raise RejectedObject(_server_message(e)) from e
            raise
        return Created.CREATED

    def _delete(self, path: str, options: Manifest) -> None:
        """404 (already gone) and 409 (uid precondition: a newer object) are success."""
        try:
            self._call("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", **options})
        except ApiException as e:
            if e.status not in (404, 409):
                raise


def _job_path(namespace: str, name: str) -> str:
    return f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}"


def _core_path(namespace: str, resource: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path
