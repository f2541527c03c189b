"""Batches of pod creates, deletes and patches (Transport.send_all through Cluster) against an
HTTP server on loopback that answers each pod by its name: what every answer means to a pass,
that the batch is bounded by `concurrency`, and that an error the pass cannot act on is raised
only once every call has ended."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from multiworker.clients import metrics
from multiworker.clients.kube import Cluster
from multiworker.clients.transport import ClientSettings, Transport
from multiworker.clients.writes import (
    Created,
    GenerationDeletion,
    PodDeletion,
    PodPatch,
    RefusalKind,
    Refused,
)

# The answer for a pod named so: (HTTP status, the server's message).
ANSWERS = {"exists": (409, "already exists"), "quota": (403, "exceeded quota: gpus"),
           "forbidden": (403, "forbidden"), "invalid": (422, "spec.containers: Required"),
           "account": (403, 'error looking up service account ns/a: serviceaccount "a" not found'),
           "gone": (404, "not found"), "newer": (409, "Precondition failed: UID"),
           "broken": (500, "etcd is sad")}


class FakeAPI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.delay = delay
        self.seen: list[tuple[str, str, str, Any]] = []  # method, path, content type, body
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: FakeAPI

    def log_message(self, *_: Any) -> None:
        pass

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        with self.server.lock:
            self.server.seen.append((self.command, self.path,
                                     self.headers.get("Content-Type", ""), body))
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        time.sleep(self.server.delay)
        name = (body or {}).get("metadata", {}).get("name") or self.path.rsplit("/", 1)[-1]
        selector = parse_qs(urlsplit(self.path).query).get("labelSelector")
        if selector:  # a collection: answered by its job's name; RBAC refuses job "rbac"'s
            name = selector[0].split(",")[0].split("=")[1].replace("rbac", "forbidden")
        status, message = ANSWERS.get(name.split("-")[0], (201, ""))
        payload = json.dumps({"kind": "Status", "code": status, "message": message}
                             if status >= 300 else {"metadata": {"name": name}}).encode()
        with self.server.lock:
            self.server.in_flight -= 1
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_DELETE = do_PATCH = answer


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    server = FakeAPI()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def cluster_for(port: int, concurrency: int = 8) -> Cluster:
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    return Cluster(Transport(client.ApiClient(configuration),
                             ClientSettings(concurrency=concurrency, timeout_seconds=10)))


@pytest.fixture
def cluster(api: FakeAPI) -> Iterator[Cluster]:
    found = cluster_for(api.server_address[1])
    yield found
    found.rest.close()


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}}


def test_each_create_answer_means_created_there_already_or_a_refusal(
    api: FakeAPI, cluster: Cluster,
) -> None:
    outcomes = cluster.create_pods([pod(n) for n in
                                    ("a-0", "exists-1", "quota-2", "forbidden-3", "invalid-4",
                                     "account-5")])
    assert outcomes[:2] == [Created.CREATED, Created.EXISTS]
    refusals = outcomes[2:]
    assert all(isinstance(r, Refused) for r in refusals)
    assert [r.kind for r in refusals if isinstance(r, Refused)] == [
        RefusalKind.QUOTA, RefusalKind.FORBIDDEN, RefusalKind.INVALID,
        RefusalKind.SERVICE_ACCOUNT]
    assert "exceeded quota: gpus" in str(refusals[0])
    assert sorted(body["metadata"]["name"] for _, _, _, body in api.seen) == [
        "a-0", "account-5", "exists-1", "forbidden-3", "invalid-4", "quota-2"]
    assert {(method, path, kind) for method, path, kind, _ in api.seen} == {
        ("POST", "/api/v1/namespaces/ns/pods", "application/json")}


def test_an_error_no_pass_can_act_on_raises_after_every_create_ended(
    api: FakeAPI, cluster: Cluster,
) -> None:
    with pytest.raises(ApiException) as raised:
        cluster.create_pods([pod("broken-0")] + [pod(f"a-{i}") for i in range(1, 20)])
    assert raised.value.status == 500
    assert "etcd is sad" in (raised.value.body or "")
    assert len(api.seen) == 20


def test_deletes_carry_the_uid_and_grace_and_count_gone_or_replaced_as_done(
    api: FakeAPI, cluster: Cluster,
) -> None:
    cluster.delete_pods([PodDeletion("ns", "a-0", "u0", grace=0),
                         PodDeletion("ns", "gone-1", "u1"),
                         PodDeletion("ns", "newer-2", "u2", grace=30)])
    bodies = {path.rsplit("/", 1)[-1]: body for method, path, _, body in api.seen
              if method == "DELETE"}
    assert bodies["a-0"] == {"kind": "DeleteOptions", "apiVersion": "v1",
                             "preconditions": {"uid": "u0"}, "gracePeriodSeconds": 0}
    assert bodies["gone-1"] == {"kind": "DeleteOptions", "apiVersion": "v1",
                                "preconditions": {"uid": "u1"}}
    assert bodies["newer-2"]["gracePeriodSeconds"] == 30
    with pytest.raises(ApiException):
        cluster.delete_pods([PodDeletion("ns", "broken-3", "u3")])


def generation(job: str, workers: int, spared: tuple[str, ...] = ()) -> GenerationDeletion:
    return GenerationDeletion(
        "ns", job, 3, tuple(PodDeletion("ns", f"{job}-worker-{i}", f"u{i}", grace=5)
                            for i in range(workers)),
        tuple(range(workers)), grace=5, spared=spared)


def test_a_generation_goes_by_label_selector_in_shards_sparing_pods_by_name(
    api: FakeAPI, cluster: Cluster,
) -> None:
    cluster.delete_generation(generation("a", 70, spared=("a-worker-9", "copy")))
    calls = [(urlsplit(path), body) for method, path, _, body in api.seen]
    assert len(calls) == 9  # 8 x 8 + 6
    assert {url.path for url, _ in calls} == {"/api/v1/namespaces/ns/pods"}
    assert all(body == {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5}
               for _, body in calls)
    queries = [parse_qs(url.query) for url, _ in calls]
    assert [(
        "multiworker.dev/job-name=a,multiworker.dev/group-generation=3,"
        "multiworker.dev/worker-index in (64,65,66,67,68,69)")] in [
        q["labelSelector"] for q in queries]
    assert all(q["fieldSelector"] == ["metadata.name!=a-worker-9,metadata.name!=copy"]
               and q["resourceVersion"] == ["0"] for q in queries)  # listed from the cache
    covered = [i for q in queries
               for i in q["labelSelector"][0].split("(")[1].rstrip(")").split(",")]
    assert sorted(map(int, covered)) == list(range(70))


def test_a_generation_goes_pod_by_pod_where_rbac_forbids_collections(
    api: FakeAPI, cluster: Cluster,
) -> None:
    cluster.delete_generation(generation("rbac", 3))
    one_by_one = sorted(path for method, path, _, _ in api.seen if "?" not in path)
    assert one_by_one == [f"/api/v1/namespaces/ns/pods/rbac-worker-{i}" for i in range(3)]


def test_a_patch_of_a_pod_gone_or_replaced_is_not_applied(
    api: FakeAPI, cluster: Cluster,
) -> None:
    patched = cluster.patch_pods([PodPatch("ns", n, "u", labels={"k": "v"})
                                  for n in ("a-0", "gone-1", "newer-2")])
    assert patched == [True, False, False]
    assert {kind for _, _, kind, _ in api.seen} == {"application/merge-patch+json"}
    assert all(body["metadata"] == {"uid": "u", "labels": {"k": "v"}, "annotations": {}}
               for _, _, _, body in api.seen)


def test_a_batch_runs_calls_in_parallel_but_never_more_than_the_concurrency() -> None:
    server = FakeAPI(delay=0.05)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cluster = cluster_for(server.server_address[1], concurrency=3)
    try:
        cluster.create_pods([pod(f"a-{i}") for i in range(12)])
    finally:
        cluster.rest.close()
        server.shutdown()
        server.server_close()
    assert len(server.seen) == 12
    assert 2 <= server.most_in_flight <= 3


def test_calls_are_counted_by_verb_resource_and_answer(api: FakeAPI, cluster: Cluster) -> None:
    def count(code: str) -> float:
        return float(metrics.API_REQUESTS.labels(verb="create", resource="pods", code=code)
                     ._value.get())
    before = count("201"), count("409")
    cluster.create_pods([pod("a-0"), pod("a-1"), pod("exists-2")])
    assert (count("201") - before[0], count("409") - before[1]) == (2, 1)


def test_an_api_server_that_refuses_connections_raises() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    cluster = cluster_for(port)
    try:
        with pytest.raises(aiohttp.ClientConnectorError):
            cluster.create_pods([pod("a-0"), pod("a-1")])
    finally:
        cluster.rest.close()
