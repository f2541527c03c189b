"""The operator's calls to the API server, in its own terms: create the pods of a group (in
parallel; a refusal says why), delete pods by uid, patch a job's status only if unchanged,
Events, Leases. How a call is made (rate limit, timeouts, metrics) is transport.py's.

Objects travel as plain camelCase dicts, exactly as the API returns them, so the pure layers
(observe, render) never see client model classes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from kubernetes.client.exceptions import ApiException

from multiworker.api import names
from multiworker.api.conditions import bounded
from multiworker.api.schema import format_time
from multiworker.clients.heartbeats import NODE_LEASES_PATH
from multiworker.clients.transport import Call, Transport
from multiworker.clients.writes import (
    Conflict,
    Created,
    GenerationDeletion,
    Gone,
    PodDeletion,
    PodPatch,
    Refused,
    refusal_kind,
    server_message,
)

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
COMPONENT = "multiworker-operator"
LEASE_CALL_SECONDS = 3.0
DELETE_SHARD = 8  # pods per DeleteCollection call: the API server deletes them one by one


MERGE = "application/merge-patch+json"
API_SERVED_TTL_SECONDS = 30.0  # how long a discovery answer (is the PodGroup API served?) holds


class Cluster:
    """The operator's reads and writes, in the API's words: conflicts, refusals, 404s and 409s
    turned into what a pass can act on. Calls go through one Transport (transport.py)."""

    def __init__(self, rest: Transport, instance: str | None = None) -> None:
        self.rest = rest
        self.instance = instance or socket.gethostname()  # Events' reportingInstance
        self._served: dict[str, tuple[bool, float]] = {}

    # --- lists and watches, for the informers ---

    def list_page(self, path: str, selector: str | None, limit: int, cont: str | None
                  ) -> Manifest:
        return self.rest.list_page(path, selector, limit, cont)

    def watch(self, path: str, selector: str | None, resource_version: str,
              server_timeout: int, decode: Callable[[bytes], Manifest]) -> Iterator[Manifest]:
        return self.rest.watch(path, selector, resource_version, server_timeout, decode)

    # --- jobs ---

    def patch_job_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> str:
        """Merge-patch the status subresource (null clears a field), only if the job is still
        at `resource_version`: a decision made on an outdated view is never written. Returns
        the job's new resource version."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        found = self._write("PATCH", names.job_path(namespace, name) + "/status", body, MERGE)
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
        errors = self.rest.send_all(
            [Call("POST", _core_path(pod["metadata"]["namespace"], "pods"), pod) for pod in pods])
        outcomes: list[Created | Refused] = []
        for error in errors:
            try:
                outcomes.append(_created(error))
            except Refused as e:
                outcomes.append(e)
        return outcomes

    def delete_pods(self, deletions: Sequence[PodDeletion]) -> None:
        """Delete pods in parallel, each by uid; already gone is success."""
        def options(d: PodDeletion) -> Manifest:
            return _delete_options({"preconditions": {"uid": d.uid}}
                                   | ({} if d.grace is None else {"gracePeriodSeconds": d.grace}))
        for error in self.rest.send_all([Call("DELETE", _core_path(d.namespace, "pods", d.name),
                                              options(d)) for d in deletions]):
            _deleted(error)

    def delete_generation(self, deletion: GenerationDeletion) -> None:
        """Delete a generation's pods by label selector (DeleteCollection), its worker indexes
        in shards of DELETE_SHARD sent at once: the API server deletes one collection's pods
        one after another. Where RBAC refuses the verb (a Role from before it was needed), the
        pods go one by one."""
        d = deletion
        body = _delete_options({} if d.grace is None else {"gracePeriodSeconds": d.grace})
        shards = [d.indexes[i:i + DELETE_SHARD] for i in range(0, len(d.indexes), DELETE_SHARD)]
        calls = [Call("DELETE", f"{_core_path(d.namespace, 'pods')}?{_collection_query(d, s)}",
                      body) for s in shards]
        errors = self.rest.send_all(calls)
        if any(e is not None and e.status == 403 for e in errors):
            log.warning("deleting pods by collection is forbidden (RBAC without "
                        "\"deletecollection\" on pods?): deleting %d pods one by one",
                        len(d.pods))
            self.delete_pods(d.pods)
            return
        for error in errors:
            _deleted(error)

    def patch_pods(self, patches: Sequence[PodPatch]) -> list[bool]:
        """Merge labels and annotations into pods in parallel: per pod, whether it was
        patched (False: gone, or replaced by a newer pod of the same name)."""
        errors = self.rest.send_all([
            Call("PATCH", _core_path(p.namespace, "pods", p.name),
                 {"metadata": {"uid": p.uid, "labels": dict(p.labels),
                               "annotations": dict(p.annotations)}},
                 content_type=MERGE)
            for p in patches])
        for error in errors:
            if error is not None and error.status not in (404, 409, 422):
                raise error
        return [error is None for error in errors]

    def create_object(self, path: str, manifest: Manifest) -> Created:
        """Create any namespaced object at its collection `path` (PodGroups, say)."""
        return self._create(path, manifest)

    def get_object(self, path: str) -> Manifest | None:
        return self._get(path)

    def get_node(self, name: str) -> Manifest | None:
        return self._get(f"/api/v1/nodes/{name}")

    def pods_on_node(self, node: str) -> list[Manifest] | None:
        """Every pod bound to `node`, in any namespace: what the scheduler counts against the
        node (spec.elastic's room, decide/elastic.py). None when this operator may not list
        pods cluster-wide (a chart without the rule)."""
        try:
            found = self.rest.call("GET", "/api/v1/pods", query=[
                ("fieldSelector", f"spec.nodeName={node}"), ("limit", "1000")])
        except ApiException as e:
            if e.status == 403:
                log.warning("listing the pods on node %s: %s %s", node, e.status, e.reason)
                return None
            raise
        return list(found.get("items") or [])

    def get_node_lease(self, name: str) -> Manifest | None:
        """The node's Lease; None when gone or unreadable (an older Role without `get`: the
        watch alone then says whether it renews)."""
        try:
            return self._get(f"{NODE_LEASES_PATH}/{name}")
        except ApiException as e:
            log.warning("reading node %s's Lease: %s %s", name, e.status, e.reason)
            return None

    def delete_object(self, path: str) -> None:
        self._delete(path, {})

    def replace_status(self, path: str, obj: Manifest, status: Manifest) -> Manifest:
        """PUT `status` as the status subresource of `obj` (as read, at `path`): refused with
        Conflict if the object changed since it was read, Gone if it is gone."""
        return self._write("PUT", f"{path}/status", {**obj, "status": status})

    def patch_object(self, path: str, patch: Manifest) -> None:
        """Merge-patch the object at `path`; gone is success."""
        with contextlib.suppress(Gone):
            self._write("PATCH", path, patch, MERGE)

    def drop_finalizer(self, path: str, obj: Manifest, finalizer: str) -> None:
        """Remove `finalizer` from `obj` (as read, at `path`), only if it has not changed
        since; gone already is success."""
        meta = obj.get("metadata", {})
        kept = [f for f in meta.get("finalizers") or [] if f != finalizer]
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "finalizers": kept}}
        with contextlib.suppress(Gone):
            self._write("PATCH", path, body, MERGE)

    def api_served(self, group_version: str, plural: str) -> bool:
        """Whether discovery lists `plural` in `group_version` (a CRD installed and
        established), remembered for API_SERVED_TTL_SECONDS."""
        now = time.monotonic()
        known = self._served.get(group_version)
        if known is None or now - known[1] > API_SERVED_TTL_SECONDS:
            found = self._get(f"/apis/{group_version}")
            served = any(r.get("name") == plural for r in (found or {}).get("resources", []))
            known = self._served[group_version] = (served, now)
        return known[0]

    # --- leases (leader election) ---

    # Lease calls give up well before the leader's deadline (leader.DEADLINE_SECONDS): a
    # renewal that arrives later is worth nothing, and a waiting call would delay the next try.
    def get_lease(self, namespace: str, name: str) -> Manifest | None:
        return self._get(_lease_path(namespace, name), timeout=LEASE_CALL_SECONDS)

    def create_lease(self, lease: Manifest) -> Manifest | None:
        """The created Lease; None when another candidate created it first."""
        try:
            return self.rest.call("POST", _lease_path(lease["metadata"]["namespace"]), lease,
                                  timeout=LEASE_CALL_SECONDS)
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def replace_lease(self, lease: Manifest) -> Manifest | None:
        """PUT with the read resourceVersion: None when someone else wrote it meanwhile."""
        meta = lease["metadata"]
        try:
            return self.rest.call("PUT", _lease_path(meta["namespace"], meta["name"]), lease,
                                  timeout=LEASE_CALL_SECONDS)
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
            "message": bounded(message),
            "source": {"component": COMPONENT},
            "reportingComponent": f"{names.GROUP}/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.rest.send("POST", _core_path(meta["namespace"], "events"), event)

    def _write(self, method: str, path: str, body: Manifest,
               content_type: str = "application/json") -> Manifest:
        """An update guarded by the resourceVersion it carries: Conflict when the object
        changed since it was read, Gone when it is gone."""
        try:
            return self.rest.call(method, path, body, content_type=content_type)
        except ApiException as e:
            if e.status == 409:
                raise Conflict(f"{path} changed since it was read") from e
            if e.status == 404:
                raise Gone(f"{path} is gone") from e
            raise

    def _get(self, path: str, timeout: float | None = None) -> Manifest | None:
        try:
            return self.rest.call("GET", path, timeout=timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _create(self, path: str, manifest: Manifest) -> Created:
        try:
            self.rest.send("POST", path, manifest)
        except ApiException as e:
            return _created(e)
        return Created.CREATED

    def _delete(self, path: str, options: Manifest) -> None:
        try:
            self.rest.send("DELETE", path, _delete_options(options))
        except ApiException as e:
            _deleted(e)


def _created(error: ApiException | None) -> Created:
    """What a create's answer means: created, or there already (409); a refusal raises
    Refused, any other error itself."""
    if error is None:
        return Created.CREATED
    if error.status == 409:
        return Created.EXISTS
    message = server_message(error)
    kind = refusal_kind(error.status or 0, message)
    if kind is not None:
        raise Refused(kind, message) from error
    raise error


def _deleted(error: ApiException | None) -> None:
    """404 (already gone) and 409 (uid precondition: a newer object) are success."""
    if error is not None and error.status not in (404, 409):
        raise error


def _collection_query(d: GenerationDeletion, indexes: Sequence[int]) -> str:
    """The label and field selectors of one shard of a GenerationDeletion."""
    labels = (f"{names.LABEL_JOB_NAME}={d.job},{names.LABEL_GROUP_GENERATION}={d.generation},"
              f"{names.LABEL_WORKER_INDEX} in ({','.join(str(i) for i in indexes)})")
    # resourceVersion=0: the API server lists the pods to delete from its watch cache. A
    # consistent list reads every pod of the namespace from etcd, per call (at 1,024 workers,
    # 128 calls of ~12 MB each made a restart ~3 s slower on this machine). A pod the cache
    # does not hold yet is deleted by the next pass, which still sees it.
    query = [("labelSelector", labels), ("resourceVersion", "0")]
    if d.spared:
        query.append(("fieldSelector", ",".join(f"metadata.name!={n}" for n in d.spared)))
    return urlencode(query)


def _delete_options(options: Manifest) -> Manifest:
    return {"kind": "DeleteOptions", "apiVersion": "v1", **options}


def _core_path(namespace: str, resource: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path


def _lease_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path
