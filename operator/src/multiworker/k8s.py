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
from typing import Any, Protocol, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from multiworker import names

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
COMPONENT = "multiworker-operator"
EVENT_MESSAGE_LIMIT = 1024


class Created(StrEnum):
    CREATED = "Created"
    EXISTS = "Exists"  # 409: it was there already; the caller checks who controls it


class ClusterIO(Protocol):
    """What a reconcile pass needs from the cluster: Cluster below, a fake in unit tests."""

    def get_job(self, namespace: str, name: str) -> Manifest | None: ...
    def patch_job_status(self, namespace: str, name: str, status: Manifest) -> None: ...
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
    """The operator's view of the API server: jobs, their pods and Service, Events."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.instance = socket.gethostname()

    # --- jobs ---

    def get_job(self, namespace: str, name: str) -> Manifest | None:
        try:
            job = self.custom.get_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return cast(Manifest, job)

    def patch_job_status(self, namespace: str, name: str, status: Manifest) -> None:
        """Merge-patch the status subresource (null clears a field)."""
        self.custom.patch_namespaced_custom_object_status(
            names.GROUP, names.VERSION, namespace, names.PLURAL, name, {"status": status}
        )

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job; owner references take its pods and Service with it."""
        body = client.V1DeleteOptions(
            propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid)
        )
        self._ignoring_gone(
            self.custom.delete_namespaced_custom_object,
            names.GROUP, names.VERSION, namespace, names.PLURAL, name, body=body,
        )

    # --- pods and services ---

    def list_pods(self, namespace: str, job: str) -> list[Manifest]:
        response: Any = self.core.list_namespaced_pod(
            namespace,
            label_selector=names.label_selector(names.job_selector(job)),
            _preload_content=False,
        )
        items: list[Manifest] = json.loads(response.data)["items"]
        return items

    def get_pod(self, namespace: str, name: str) -> Manifest | None:
        return self._get(self.core.read_namespaced_pod, namespace, name)

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        return self._get(self.core.read_namespaced_service, namespace, name)

    def create_pod(self, pod: Manifest) -> Created:
        return self._create(self.core.create_namespaced_pod, pod)

    def create_service(self, service: Manifest) -> Created:
        return self._create(self.core.create_namespaced_service, service)

    def delete_pod(self, namespace: str, name: str, uid: str, grace: int | None = None) -> None:
        """Delete one pod by uid (never a newer pod of the same name); `grace` None keeps the
        pod's own terminationGracePeriodSeconds so workers can checkpoint on SIGTERM."""
        body = client.V1DeleteOptions(
            grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=uid)
        )
        self._ignoring_gone(self.core.delete_namespaced_pod, name, namespace, body=body)

    # --- events ---

    def emit_event(
        self, job: Manifest, type_: str, reason: str, message: str, now: datetime
    ) -> None:
        """A core/v1 Event on the job (what `kubectl describe mwj` shows)."""
        meta = job["metadata"]
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{meta['name']}.", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=names.API_VERSION, kind=names.KIND, name=meta["name"],
                namespace=meta["namespace"], uid=meta.get("uid"),
            ),
            type=type_,
            reason=reason,
            message=message[:EVENT_MESSAGE_LIMIT],
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=f"{names.GROUP}/operator",
            reporting_instance=self.instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self.core.create_namespaced_event(meta["namespace"], event)

    # --- helpers ---

    def _get(self, read: Any, namespace: str, name: str) -> Manifest | None:
        try:
            response = read(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        found: Manifest = json.loads(response.data)
        return found

    def _create(self, create: Any, manifest: Manifest) -> Created:
        try:
            create(manifest["metadata"]["namespace"], manifest, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return Created.EXISTS
            if e.status in (400, 422):
                raise RejectedObject(_server_message(e)) from e
            raise
        return Created.CREATED

    def _ignoring_gone(self, call: Any, *args: Any, **kwargs: Any) -> None:
        """404 (already gone) and 409 (uid precondition: a newer object) are success."""
        try:
            call(*args, **kwargs)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
