"""The Python client against recorded API answers: a small HTTP server on 127.0.0.1 (nothing
leaves the machine) serves the JSON a real API server sends for the paths the client calls, and
a kubeconfig points at it, so the kubernetes package's own code runs: configuration, requests,
errors, and watch streams. `FakeApi` is shared with test_client_watch.py,
test_client_logs.py and test_kubectl_mwj.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from multiworker.client import (
    ApiError,
    Client,
    ClusterUnreachable,
    InvalidJob,
    JobNotFound,
)

NAMESPACE = "team"
JOBS = f"/apis/multiworker.dev/v1alpha1/namespaces/{NAMESPACE}/multiworkerjobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"
CLAIMS = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
CONFIG_MAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
Obj = dict[str, Any]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str


@dataclass
class Answer:
    """What the fake sends: a JSON object, plain text, or (a watch, a followed log) lines
    written one by one, `pause` seconds apart, before the stream closes."""

    status: int = 200
    body: Any = None
    text: str | None = None
    lines: list[Any] | None = None
    pause: float = 0.0


Route = Callable[[Request], Answer]


def status_error(code: int, reason: str, message: str, kind: str | None = "multiworkerjobs",
                 name: str = "") -> Answer:
    """An error as the API server writes it: a Status object."""
    details = {"name": name, "group": "multiworker.dev", "kind": kind} if kind else {}
    return Answer(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Failure", "message": message, "reason": reason,
                         "details": details, "code": code})


@dataclass
class FakeApi:
    """Recorded answers by (method, path, watch); every request is kept for assertions. An
    unknown path answers as the API server does: 404, `404 page not found`."""

    routes: dict[tuple[str, str, bool], Route] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def on(self, method: str, path: str, *answers: Answer | Route, watch: bool = False) -> None:
        """Answer in this order, the last one again and again."""
        queue = list(answers)

        def route(request: Request) -> Answer:
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
            return answer(request) if callable(answer) else answer
        self.routes[(method, path, watch)] = route

    def sent(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self, method: str) -> None:
                url = urlsplit(self.path)
                query = dict(parse_qsl(url.query))
                size = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(size) if size else b""
                request = Request(method, url.path, query, json.loads(data) if data else None,
                                  self.headers.get("Content-Type", ""))
                fake.requests.append(request)
                watch = query.get("watch") in ("true", "True")
                route = fake.routes.get((method, url.path, watch))
                answer = route(request) if route else Answer(404, text="404 page not found")
                fake.send(self, answer)

            def do_GET(self) -> None:
                self.handle_one("GET")

            def do_POST(self) -> None:
                self.handle_one("POST")

            def do_PATCH(self) -> None:
                self.handle_one("PATCH")

            def do_DELETE(self) -> None:
                self.handle_one("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, answer: Answer) -> None:
        handler.send_response(answer.status)
        if answer.lines is not None:
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            for line in answer.lines:
                text = line if isinstance(line, str) else json.dumps(line)
                try:
                    handler.wfile.write(text.encode() + b"\n")
                    handler.wfile.flush()
                except OSError:
                    return
                time.sleep(answer.pause)
            return
        if answer.text is not None:
            data, kind = answer.text.encode(), "text/plain"
        else:
            data, kind = json.dumps(answer.body or {}).encode(), "application/json"
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def kubeconfig(path: Path, server: str) -> Path:
    """Two contexts on one server: `fake` (namespace team, current) and `other` (none)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "secret"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me",
                                                  "namespace": NAMESPACE}},
                     {"name": "other", "context": {"cluster": "fake", "user": "me"}}]}))
    return path




def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- recorded objects

HISTORY = [
    {"generation": 0, "workers": 2, "path": "Created", "started": "2026-11-29T16:00:00Z",
     "running": "2026-11-29T16:00:12Z", "resumedFromStep": 0, "ended": "2026-11-29T16:01:03Z",
     "reason": "WorkerFailed", "message": "worker-0 exited 137 (Error)", "lastStep": 140,
     "stepsLost": 40},
    {"generation": 1, "workers": 2, "path": "InPlace", "trainerStart": "warm",
     "started": "2026-11-29T16:01:03Z", "running": "2026-11-29T16:01:05Z",
     "resumedFromStep": 100, "ended": "2026-11-29T16:02:00Z", "reason": "ChiefSucceeded",
     "message": "worker-0 exited 0"},
]


def job_body(name: str = "digits", phase: str | None = "Running", generation: int = 0,
             version: str = "100", **status: Any) -> Obj:
    """A job as the API server returns it (status as the operator writes it)."""
    body: Obj = {
        "apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}",
                     "resourceVersion": version, "generation": 1,
                     "creationTimestamp": "2026-11-29T15:59:58Z"},
        "spec": {"workers": 2, "template": {"spec": {"containers": [
            {"name": "tensorflow", "image": "multiworker.local/worker:dev"}]}}},
    }
    if phase is not None:
        body["status"] = {"phase": phase, "groupGeneration": generation, "ready": "2/2",
                          "readyWorkers": 2, "totalWorkers": 2, **status}
    return body


def job_list(*items: Obj, version: str = "100") -> Answer:
    return Answer(body={"apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJobList",
                        "metadata": {"resourceVersion": version}, "items": list(items)})


def event(kind: str, body: Obj) -> Obj:
    return {"type": kind, "object": body}


FAILED: Obj = {
    "conditions": [{"type": "Failed", "status": "True", "reason": "RestartLimitExceeded",
                    "message": "worker-1 exited 1 (Error); no restarts left (3 of 3)",
                    "lastTransitionTime": "2026-11-29T16:05:00Z"}],
    "lastFailure": {"worker": 1, "generation": 3, "reason": "Error", "exitCode": 1,
                    "message": "Traceback ... ValueError", "time": "2026-11-29T16:04:59Z",
                    "action": "FailJob"},
    "restarts": 3,
}


# -- connecting

def test_the_namespace_is_the_contexts_unless_named(api: FakeApi) -> None:
    assert Client().namespace == NAMESPACE
    assert Client(namespace="mine").namespace == "mine"
    assert Client(context="other").namespace == "default"


def test_an_unknown_context_or_a_missing_kubeconfig_is_one_clear_error(
        api: FakeApi, tmp_path: Path) -> None:
    with pytest.raises(ClusterUnreachable, match="nowhere"):
        Client(context="nowhere")
    with pytest.raises(ClusterUnreachable, match="does not exist"):
        Client(kubeconfig=str(tmp_path / "absent"))


def test_an_unreachable_cluster_is_one_line_not_urllib3s_traceback(tmp_path: Path) -> None:
    port = closed_port()
    client = Client(kubeconfig=str(kubeconfig(tmp_path / "k", f"http://127.0.0.1:{port}")))
    with pytest.raises(ClusterUnreachable) as caught:
        client.list()
    assert str(caught.value).startswith(f"cannot reach the cluster at http://127.0.0.1:{port} "
                                        "(connection refused)")
    assert "\n" not in str(caught.value)


# -- submitting

def created(request: Request) -> Answer:
    """The API server's answer to a create: the object with its uid and status-less."""
    body = dict(request.body)
    body["metadata"] = {**body["metadata"], "uid": "uid-new", "resourceVersion": "1"}
    return Answer(201, body)


def test_submit_builds_checks_and_creates_with_strict_field_validation(api: FakeApi) -> None:
    api.on("GET", f"{CLAIMS}/ckpt", Answer(body={"kind": "PersistentVolumeClaim"}))
    api.on("POST", JOBS, created)
    job = Client().submit(name="digits", image="img:1", command=["python3", "train.py"],
                          workers=2, checkpoint_claim="ckpt", restart_mode="InPlace",
                          env={"TRAIN_EPOCHS": "3"})
    assert (job.name, job.namespace, job.manifest["metadata"]["uid"]) == \
        ("digits", NAMESPACE, "uid-new")
    (post,) = api.sent("POST", JOBS)
    assert post.query.get("fieldValidation") == "Strict"
    spec = post.body["spec"]
    assert (spec["workers"], spec["checkpoint"], spec["restartPolicy"]) == \
        (2, {"claimName": "ckpt"}, {"mode": "InPlace"})
    (container,) = spec["template"]["spec"]["containers"]
    assert container == {"name": "tensorflow", "image": "img:1",
                         "args": ["python3", "train.py"],
                         "env": [{"name": "TRAIN_EPOCHS", "value": "3"}]}


def test_a_missing_claim_is_refused_before_anything_is_created(api: FakeApi) -> None:
    api.on("GET", f"{CLAIMS}/gone", status_error(
        404, "NotFound", 'persistentvolumeclaims "gone" not found', "persistentvolumeclaims"))
    with pytest.raises(InvalidJob, match="spec.checkpoint.claimName: PersistentVolumeClaim "
                                         "'gone' does not exist in namespace team"):
        Client().submit(name="x", image="i", command=["true"], checkpoint_claim="gone")
    assert not api.sent("POST", JOBS)


def test_bad_input_names_every_field_before_it_is_sent(api: FakeApi) -> None:
    with pytest.raises(InvalidJob, match=r"command is a list of words, e.g. \['python3', 't.py'\]"):
        Client().submit(name="x", image="i", command="python3 t.py")
    with pytest.raises(InvalidJob) as caught:
        Client().submit(name="Bad_Name", image="i", command=["true"], workers=0,
                        restart_mode="Sideways")
    said = str(caught.value)
    assert "spec.workers: Input should be greater than or equal to 1" in said
    assert "spec.restartPolicy.mode: Input should be 'InPlace' or 'Recreate'" in said
    assert not api.requests


@pytest.mark.parametrize(("answer", "error", "said"), [
    (status_error(400, "BadRequest", 'strict decoding error: unknown field "spec.wrokers"'),
     InvalidJob, 'strict decoding error: unknown field "spec.wrokers"'),
    (status_error(422, "Invalid", 'MultiWorkerJob.multiworker.dev "x" is invalid: spec.workers: '
                  "Invalid value: 2000: spec.workers in body should be less than or equal to "
                  "1024"), InvalidJob, "spec.workers in body should be less than or equal"),
    (status_error(409, "AlreadyExists", 'multiworkerjobs.multiworker.dev "x" already exists'),
     InvalidJob, '"x" already exists'),
    (Answer(404, text="404 page not found"), ApiError,
     "the MultiWorkerJob API (multiworkerjobs.multiworker.dev) is not installed"),
    (status_error(403, "Forbidden", 'multiworkerjobs.multiworker.dev is forbidden: User "me" '
                  'cannot create resource "multiworkerjobs"'), ApiError,
     'create job team/x: forbidden: multiworkerjobs.multiworker.dev is forbidden'),
])
def test_the_api_servers_refusal_is_its_own_message(
        api: FakeApi, answer: Answer, error: type[Exception], said: str) -> None:
    api.on("POST", JOBS, answer)
    with pytest.raises(error) as caught:
        Client().submit(name="x", image="i", command=["true"])
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_script_ships_in_a_configmap_the_job_owns(api: FakeApi, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    api.on("POST", CONFIG_MAPS, Answer(201, {"kind": "ConfigMap"}))
    api.on("POST", JOBS, created)
    api.on("PATCH", f"{CONFIG_MAPS}/hello-script", Answer(body={"kind": "ConfigMap"}))
    Client().submit(name="hello", image="i", script=script, args=["--fast"])
    (config_map,) = api.sent("POST", CONFIG_MAPS)
    assert config_map.body["data"] == {"train.py": "print('hello')\n"}
    (job,) = api.sent("POST", JOBS)
    container = job.body["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["python3", "/opt/mwj-script/train.py", "--fast"]
    assert container["volumeMounts"] == [{"name": "mwj-script", "mountPath": "/opt/mwj-script",
                                          "readOnly": True}]
    (owned,) = api.sent("PATCH", f"{CONFIG_MAPS}/hello-script")
    assert owned.content_type == "application/merge-patch+json"
    assert owned.body["metadata"]["ownerReferences"] == [
        {"apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob", "name": "hello",
         "uid": "uid-new", "blockOwnerDeletion": False}]


def test_a_job_refused_takes_its_scripts_configmap_away(api: FakeApi, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    api.on("POST", CONFIG_MAPS, Answer(201, {"kind": "ConfigMap"}))
    api.on("POST", JOBS, status_error(409, "AlreadyExists", "already exists"))
    api.on("DELETE", f"{CONFIG_MAPS}/hello-script", Answer(body={"kind": "Status"}))
    with pytest.raises(InvalidJob, match="already exists"):
        Client().submit(name="hello", image="i", script=script)
    assert api.sent("DELETE", f"{CONFIG_MAPS}/hello-script")


def test_a_manifest_file_with_options_laid_over(api: FakeApi, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_body(phase=None)))
    api.on("POST", JOBS, created)
    Client().submit(str(path), name="renamed", workers=3)
    (post,) = api.sent("POST", JOBS)
    assert (post.body["metadata"]["name"], post.body["spec"]["workers"]) == ("renamed", 3)
    with pytest.raises(InvalidJob, match="no-such.yaml"):
        Client().submit(str(tmp_path / "no-such.yaml"))


# -- reading and changing

def test_get_list_suspend_resume_delete(api: FakeApi) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body(history=HISTORY)))
    api.on("GET", f"{JOBS}/gone", status_error(404, "NotFound",
                                               'multiworkerjobs.multiworker.dev "gone" not found'))
    api.on("GET", JOBS, job_list(job_body("b"), job_body("a")))
    api.on("PATCH", f"{JOBS}/digits", lambda r: Answer(body=job_body()))
    api.on("DELETE", f"{JOBS}/digits", Answer(body={"kind": "Status"}))
    client = Client()
    job = client.get("digits")
    assert job.status().phase == "Running"
    assert [(r.generation, r.path, r.steps_lost) for r in job.history()] == \
        [(0, "Created", 40), (1, "InPlace", None)]
    with pytest.raises(JobNotFound, match="job team/gone not found"):
        client.get("gone")
    assert [j.name for j in client.list("team=vision")] == ["a", "b"]
    assert api.sent("GET", JOBS)[-1].query["labelSelector"] == "team=vision"
    client.suspend("digits")
    client.resume("digits")
    patches = api.sent("PATCH", f"{JOBS}/digits")
    assert [p.body for p in patches] == [{"spec": {"suspend": True}}, {"spec": {"suspend": False}}]
    assert {p.content_type for p in patches} == {"application/merge-patch+json"}
    client.delete("digits")
    assert api.sent("DELETE", f"{JOBS}/digits")


def test_events_oldest_first(api: FakeApi) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body()))
    api.on("GET", EVENTS, Answer(body={"items": [
        {"type": "Warning", "reason": "WorkerFailed", "message": "restarting group",
         "lastTimestamp": "2026-11-29T16:01:03Z", "count": 2},
        {"type": "Normal", "reason": "GroupCreated", "message": "created 2 workers",
         "eventTime": "2026-11-29T16:00:00.123456Z"}]}))
    events = Client().get("digits").events()
    assert [(e.reason, e.count) for e in events] == [("GroupCreated", 1), ("WorkerFailed", 2)]
    assert api.sent("GET", EVENTS)[0].query["fieldSelector"] == \
        "involvedObject.name=digits,involvedObject.kind=MultiWorkerJob"
