"""The Python client's pure parts, table by table: the manifest `submit` builds and what it
refuses, what API errors and an unreachable server say, what a watched status means to a wait,
Events in order; and that `import multiworker.client` needs neither kopf nor TensorFlow."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
import urllib3
from multiworker.api.status import JobStatus
from multiworker.client import ApiError, ClientError, InvalidJob, JobNotFound
from multiworker.client.connection import (
    api_error,
    kubeconfig_path,
    not_found_kind,
    server_message,
    unreachable_message,
)
from multiworker.client.display import Lines, display
from multiworker.client.events import events_of
from multiworker.client.manifest import (
    JobOptions,
    build_manifest,
    looks_like_text,
    merged_env,
    owner_reference,
    parse_manifest,
    problems,
    script_config_map,
)
from multiworker.client.progress import (
    Outcome,
    failure,
    phases,
    update_of,
    wait_outcome,
)

from tests.cluster import REPO

Obj = dict[str, Any]
CPU_EXAMPLE = (REPO / "examples" / "cpu-job.yaml").read_text()


def container_of(job: Obj) -> Obj:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


# -- building the manifest

def test_a_job_from_options_alone() -> None:
    job = build_manifest(None, JobOptions(
        name="digits", image="img:1", command=["python3", "train.py"], args=["--epochs", "3"],
        workers=4, gpus_per_worker=1, cpu="2", memory="4Gi", env={"A": "1"},
        checkpoint_claim="ckpt", restart_mode="InPlace", max_restarts=5,
        elastic_min_workers=2, queue="team-a", labels={"owner": "me"}))
    assert job["apiVersion"] == "multiworker.dev/v1alpha1" and job["kind"] == "MultiWorkerJob"
    assert job["metadata"] == {"name": "digits", "labels": {
        "owner": "me", "kueue.x-k8s.io/queue-name": "team-a"}}
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        "workers": 4, "checkpoint": {"claimName": "ckpt"},
        "restartPolicy": {"mode": "InPlace", "maxRestarts": 5}, "elastic": {"minWorkers": 2}}
    assert container_of(job) == {
        "name": "tensorflow", "image": "img:1", "args": ["python3", "train.py", "--epochs", "3"],
        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "4Gi"},
                      "requests": {"cpu": "2", "memory": "4Gi"}},
        "env": [{"name": "A", "value": "1"}]}
    assert problems(job) == []


def test_options_over_a_manifest_change_only_what_they_name() -> None:
    base = parse_manifest(CPU_EXAMPLE)
    job = build_manifest(base, JobOptions(workers=2, restart_mode="InPlace",
                                          env={"TRAIN_EPOCHS": "3", "EXTRA": "x"}))
    assert base["spec"]["workers"] == 3, "the manifest given is not changed"
    assert job["spec"]["workers"] == 2
    assert job["spec"]["restartPolicy"]["mode"] == "InPlace"
    assert job["spec"]["restartPolicy"]["maxRestarts"] == 3  # kept
    container = container_of(job)
    assert container["args"] == container_of(base)["args"]
    assert [(e["name"], e["value"]) for e in container["env"]] == [
        ("TRAIN_EPOCHS", "3"), ("TRAIN_MODEL_PATH", "/checkpoints/model/digits.keras"),
        ("EXTRA", "x")]
    assert container["resources"] == container_of(base)["resources"]
    assert problems(job) == []


@pytest.mark.parametrize(("options", "args"), [
    (JobOptions(args=["--epochs", "3"]),
     ["python3", "/opt/multiworker/examples/training/digits.py", "--epochs", "3"]),
    (JobOptions(command=["python3", "other.py"]), ["python3", "other.py"]),
    (JobOptions(script="mine.py", args=["-v"]), ["python3", "/opt/mwj-script/mine.py", "-v"]),
])
def test_the_command_line(options: JobOptions, args: list[str]) -> None:
    job = build_manifest(parse_manifest(CPU_EXAMPLE), options)
    assert container_of(job)["args"] == args
    assert "command" not in container_of(job)


def test_a_script_is_mounted_from_its_configmap() -> None:
    job = build_manifest(None, JobOptions(name="hello", image="i", script="train.py"))
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "mwj-script", "configMap": {"name": "hello-script"}}]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "mwj-script", "mountPath": "/opt/mwj-script", "readOnly": True}]
    shipped = script_config_map("hello", "team", "train.py", "print(1)\n")
    assert shipped["metadata"] == {"name": "hello-script", "namespace": "team",
                                   "labels": {"multiworker.dev/job-name": "hello"}}
    assert shipped["data"] == {"train.py": "print(1)\n"}
    assert owner_reference({"metadata": {"name": "hello", "uid": "u1"}}) == {
        "apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob", "name": "hello",
        "uid": "u1", "blockOwnerDeletion": False}


def test_the_training_container_is_tensorflow_else_the_first() -> None:
    base = {"spec": {"template": {"spec": {"containers": [
        {"name": "sidecar", "image": "s"}, {"name": "tensorflow", "image": "t"}]}}}}
    job = build_manifest(base, JobOptions(image="new"))
    assert [c["image"] for c in job["spec"]["template"]["spec"]["containers"]] == ["s", "new"]


@pytest.mark.parametrize(("env", "values", "expected"), [
    ([], {"A": "1"}, [("A", "1")]),
    ([{"name": "A", "value": "0"}, {"name": "B", "valueFrom": {}}], {"A": "1", "C": "3"},
     [("A", "1"), ("B", None), ("C", "3")]),
])
def test_merged_env(env: list[Obj], values: dict[str, str],
                    expected: list[tuple[str, str | None]]) -> None:
    assert [(e["name"], e.get("value")) for e in merged_env(env, values)] == expected


@pytest.mark.parametrize(("base", "options", "said"), [
    (None, JobOptions(name="x", image="i"), "a job needs a command or a script"),
    ({"spec": {"template": "nope"}}, JobOptions(), "spec.template: must be a mapping"),
    ({"metadata": []}, JobOptions(), "metadata: must be a mapping"),
    ({"spec": {"template": {"spec": {"containers": {}}}}}, JobOptions(),
     "spec.template.spec.containers: must be a list"),
])
def test_shapes_the_options_cannot_be_laid_on(base: Obj | None, options: JobOptions,
                                               said: str) -> None:
    with pytest.raises(InvalidJob, match=said):
        build_manifest(base, options)


@pytest.mark.parametrize(("change", "expected"), [
    ({}, []),
    ({"workers": 0}, ["spec.workers: Input should be greater than or equal to 1"]),
    ({"restartPolicy": {"mode": "Sometimes"}},
     ["spec.restartPolicy.mode: Input should be 'InPlace' or 'Recreate'"]),
    ({"elastic": {"minWorkers": 5}},
     ["spec: elastic.minWorkers must not exceed workers"]),
    ({"checkpoint": {"claimName": ""}},
     ["spec.checkpoint.claimName: String should have at least 1 character"]),
    ({"template": None},
     ["spec.template: Input should be a valid dictionary or instance of PodTemplate"]),
])
def test_problems_name_each_field(change: Obj, expected: list[str]) -> None:
    job = parse_manifest(CPU_EXAMPLE)
    job["spec"].update(change)
    assert problems(job) == expected


def test_a_manifest_without_workers_is_not_given_one() -> None:
    job = parse_manifest(CPU_EXAMPLE)
    del job["spec"]["workers"]
    assert problems(build_manifest(job, JobOptions())) == ["spec.workers: Field required"]
    assert build_manifest(None, JobOptions(command=["true"]))["spec"]["workers"] == 1


def test_problems_of_the_name_and_the_kind() -> None:
    job = parse_manifest(CPU_EXAMPLE)
    job["metadata"]["name"] = "Digits_CPU"
    job["kind"] = "TFJob"
    found = problems(job)
    assert found[0] == "kind: a multiworker.dev/v1alpha1 MultiWorkerJob is needed, not " \
                       "multiworker.dev/v1alpha1 TFJob"
    assert found[1].startswith("metadata.name: 'Digits_CPU' must be a DNS-1035 label")
    del job["metadata"]["name"]
    assert "metadata.name: required" in problems(job)[1]


@pytest.mark.parametrize(("text", "said"), [
    ("a: [", "manifest is not valid YAML"),
    ("kind: Pod\n", "manifest holds 0 MultiWorkerJob documents; one is needed"),
    (CPU_EXAMPLE + "---\n" + CPU_EXAMPLE, "holds 2 MultiWorkerJob documents"),
])
def test_manifests_that_hold_no_one_job(text: str, said: str) -> None:
    with pytest.raises(InvalidJob, match=said):
        parse_manifest(text)


def test_a_manifest_beside_its_claim_is_the_job() -> None:
    claim = "kind: PersistentVolumeClaim\nmetadata: {name: c}\n---\n"
    assert parse_manifest(claim + CPU_EXAMPLE)["metadata"]["name"] == "digits-cpu"


@pytest.mark.parametrize(("source", "text"), [
    ("examples/cpu-job.yaml", False), ("job.yaml", False), ('{"kind": "x"}', True),
    ("kind: MultiWorkerJob\nspec: {}\n", True),
])
def test_text_or_a_file(source: str, text: bool) -> None:
    assert looks_like_text(source) is text


# -- what the API's answers mean

JOB_NOT_FOUND = ('{"kind":"Status","status":"Failure","message":"multiworkerjobs.multiworker.dev'
                 ' \\"x\\" not found","reason":"NotFound","details":{"name":"x","group":'
                 '"multiworker.dev","kind":"multiworkerjobs"},"code":404}')


@pytest.mark.parametrize(("body", "message"), [
    ('{"kind":"Status","message":"a\\n  b"}', "a b"),
    ("404 page not found\n", "404 page not found"),
    (b'{"kind":"Status"}', '{"kind":"Status"}'),
    (None, ""),
])
def test_server_message(body: str | bytes | None, message: str) -> None:
    assert server_message(body) == message


@pytest.mark.parametrize(("status", "body", "kind", "said"), [
    (400, '{"message":"unknown field \\"spec.x\\""}', InvalidJob, 'unknown field "spec.x"'),
    (422, '{"message":"spec.workers: Invalid value"}', InvalidJob, "spec.workers: Invalid value"),
    (409, '{"message":"already exists"}', InvalidJob, "already exists"),
    (404, JOB_NOT_FOUND, JobNotFound, 'multiworkerjobs.multiworker.dev "x" not found'),
    (404, "404 page not found", ApiError,
     "create job t/x: the MultiWorkerJob API (multiworkerjobs.multiworker.dev) is not installed"),
    (401, '{"message":"Unauthorized"}', ApiError, "create job t/x: unauthorized (Unauthorized)"),
    (403, '{"message":"denied"}', ApiError, "create job t/x: forbidden: denied"),
    (500, "", ApiError, "create job t/x: 500 HTTP 500"),
])
def test_api_errors(status: int, body: str, kind: type[ClientError], said: str) -> None:
    error = api_error(status, body, "create job t/x")
    assert type(error) is kind and str(error).startswith(said), str(error)


def test_not_found_kind() -> None:
    assert not_found_kind(JOB_NOT_FOUND) == "multiworkerjobs"
    assert not_found_kind("404 page not found") is None


NO_POOL: Any = None  # urllib3's errors name the pool; these messages need none
REFUSED = "Failed to establish a new connection: [Errno 111] Connection refused"


@pytest.mark.parametrize(("error", "why"), [
    (urllib3.exceptions.MaxRetryError(
        NO_POOL, "/", urllib3.exceptions.NewConnectionError(NO_POOL, REFUSED)),
     "connection refused"),
    (urllib3.exceptions.ConnectTimeoutError("timed out"), "timed out"),
    (urllib3.exceptions.MaxRetryError(NO_POOL, "/", urllib3.exceptions.SSLError(
        "CERTIFICATE_VERIFY_FAILED")), "TLS error: CERTIFICATE_VERIFY_FAILED"),
    (urllib3.exceptions.ProtocolError("Connection aborted."), "Connection aborted."),
])
def test_unreachable_messages(error: Exception, why: str) -> None:
    assert unreachable_message("https://h:6443", error) == (
        f"cannot reach the cluster at https://h:6443 ({why}): is it running, and do KUBECONFIG, "
        "--kubeconfig or --context point at it?")


def test_which_kubeconfig(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubeconfig_path("/given", {"KUBECONFIG": "/env"}) == "/given"
    assert kubeconfig_path(None, {"KUBECONFIG": "/a:/b"}) == "/a:/b"
    assert kubeconfig_path(None, {}) is None  # none at ~/.kube/config: in-cluster
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("")
    assert kubeconfig_path(None, {}) == str(tmp_path / ".kube" / "config")


# -- what a watched status means

def status(phase: str | None, **fields: Any) -> JobStatus:
    return JobStatus.model_validate({"phase": phase, **fields})


@pytest.mark.parametrize(("phase", "until", "outcome"), [
    ("Running", {"Succeeded"}, None),
    ("Succeeded", {"Succeeded"}, Outcome.REACHED),
    ("Running", {"Running", "Succeeded"}, Outcome.REACHED),
    ("Failed", {"Succeeded"}, Outcome.FAILED),
    ("Failed", {"Failed"}, Outcome.REACHED),
    ("Succeeded", {"Running"}, Outcome.SUCCEEDED),
    (None, {"Succeeded"}, None),
    ("Suspended", {"Suspended"}, Outcome.REACHED),
])
def test_wait_outcome(phase: str | None, until: set[str], outcome: Outcome | None) -> None:
    assert wait_outcome(status(phase), phases(until)) is outcome


@pytest.mark.parametrize(("until", "said"), [
    (["Finished"], "'Finished' is not a phase; one of Pending, Starting"),
    ([], "nothing to wait for"),
])
def test_phases_refused(until: list[str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        phases(until)


def test_an_update_of_a_status() -> None:
    update = update_of(status("Running", groupGeneration=2, ready="3/3", progress={
        "step": 420, "epoch": 7, "stepsPerSecond": 12.34, "loss": 0.123456,
        "updatedAt": "2026-11-29T16:00:00Z"}))
    assert (update.phase, update.generation, update.ready, update.step, update.epoch) == \
        ("Running", 2, "3/3", 420, 7)
    assert update.time == datetime(2026, 11, 29, 16, tzinfo=UTC)
    assert not update.finished and update_of(status("Failed")).finished
    assert str(update) == "Running  gen 2  ready 3/3  step 420  epoch 7  loss 0.1235  " \
                          "12.3 steps/s"
    assert str(update_of(status(None))) == "Pending  gen 0"


def test_a_failure_without_a_condition_still_says_the_job() -> None:
    error = failure("x", status("Failed"))
    assert (str(error), error.reason, error.last_failure) == ("job x failed", "", None)


def test_events_in_order_of_their_last_time() -> None:
    events = events_of([
        {"reason": "B", "type": "Normal", "message": "b", "lastTimestamp": "2026-11-29T16:00:02Z"},
        {"reason": "A", "type": "Normal", "message": "a",
         "metadata": {"creationTimestamp": "2026-11-29T16:00:01Z"}},
        {"reason": "C", "type": "Warning", "message": "c",
         "eventTime": "2026-11-29T16:00:03.5Z", "series": {"count": 4}},
        {"reason": "Z", "type": "Normal", "message": "no time"},
    ])
    assert [e.reason for e in events] == ["Z", "A", "B", "C"]
    assert str(events[-1]) == "16:00:03 Warning C: c (x4)"


# -- what importing needs

def test_the_client_imports_without_kopf_or_tensorflow() -> None:
    """`pip install multiworker` brings neither: importing them must fail, and the client
    (and kubectl mwj) must not care."""
    code = ("import sys\n"
            "for name in ('kopf', 'tensorflow', 'keras', 'aiohttp', 'msgspec', 'uvloop',\n"
            "             'prometheus_client'):\n"
            "    sys.modules[name] = None\n"
            "import multiworker.client, multiworker.client.plugin\n"
            "from multiworker.client import Client, Job, LogLine\n"
            "banned = {'multiworker.clients', 'multiworker.decide', 'multiworker.reconcile',\n"
            "          'multiworker.runtime', 'multiworker.pod'}\n"
            "print(sorted(m for m in sys.modules if m in banned))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


class FakeBar:
    """What Job.follow's bar needs of tqdm."""

    made: ClassVar[list[FakeBar]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.n, self.closed = kwargs, 0, False
        self.shown: list[tuple[str, int, dict[str, Any]]] = []
        FakeBar.made.append(self)

    def set_description(self, text: str) -> None:
        self.description = text

    def set_postfix(self, values: dict[str, Any], refresh: bool) -> None:
        self.postfix = values

    def refresh(self) -> None:
        self.shown.append((self.description, self.n, dict(self.postfix)))

    def close(self) -> None:
        self.closed = True


def test_a_progress_bar_where_tqdm_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = FakeBar  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    shown = display(True, io.StringIO())
    shown.show(update_of(status("Running", groupGeneration=1, ready="2/2",
                                progress={"step": 42, "epoch": 2, "loss": 0.25})))
    shown.close()
    (bar,) = FakeBar.made
    assert bar.shown == [("Running gen 1", 42, {"ready": "2/2", "epoch": 2, "loss": "0.25"})]
    assert bar.closed and bar.kwargs["unit"] == "step"
    assert isinstance(display(False, io.StringIO()), Lines)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # not installed
    assert isinstance(display(True, io.StringIO()), Lines)
