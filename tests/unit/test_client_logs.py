"""The workers' logs as one stream: which generation a line belongs to (the warm launcher's
headers, a restarted container's previous log, the pod's annotations and labels), which lines
a reader asked for, and what is said of logs the cluster no longer has; then reading and
following them through the fake API server (test_client_http.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from multiworker.client import Client, LogLine, logstreams
from multiworker.client.loglines import (
    HOLD_LIMIT,
    ContainerLog,
    Header,
    Labeller,
    LogFilter,
    Selection,
    container_logs,
    current_generation,
    gone_note,
    label_log,
    parse_header,
    previous_generation,
    split_timestamp,
    trainer_container,
)

from tests.unit.test_client_http import (
    JOBS,
    PODS,
    Answer,
    FakeApi,
    Request,
    job_body,
    status_error,
)

Obj = dict[str, Any]
WARM = "==== multiworker: generation 2 of worker 0, warm start (spare ready for 3.2s) at " \
       "2026-11-29T16:00:00Z ===="
COLD = "==== multiworker: generation 1 of worker 3, cold start (the container's first " \
       "trainer) at 2026-11-29T16:00:00Z ===="


@pytest.mark.parametrize(("text", "header"), [
    (WARM, Header(2, "0", "warm start (spare ready for 3.2s)")),
    (COLD, Header(1, "3", "cold start (the container's first trainer)")),
    (WARM + "\r", Header(2, "0", "warm start (spare ready for 3.2s)")),
    ("==== multiworker: generation x of worker 0, warm start at t ====", None),
    ("multiworker launcher: spare ready", None),
    ("epoch 3/20 done", None),
    ("  " + WARM, None),
])
def test_parse_header(text: str, header: Header | None) -> None:
    assert parse_header(text) == header


@pytest.mark.parametrize(("line", "time", "text"), [
    ("2026-11-29T16:00:01.123456789Z step 10", datetime(2026, 11, 29, 16, 0, 1, 123456, UTC),
     "step 10"),
    ("2026-11-29T16:00:01Z step 10", datetime(2026, 11, 29, 16, 0, 1, tzinfo=UTC), "step 10"),
    ("2026-11-29T16:00:01.5+01:00 x", datetime(2026, 11, 29, 15, 0, 1, 500000, UTC), "x"),
    ("no time here", None, "no time here"),
    ("2026-11-29T16:00:01Z ", datetime(2026, 11, 29, 16, 0, 1, tzinfo=UTC), ""),
])
def test_split_timestamp(line: str, time: datetime | None, text: str) -> None:
    assert split_timestamp(line) == (time, text)


def test_lines_after_a_header_belong_to_its_generation() -> None:
    """The launcher's start-up lines are its first generation's, which the pod (labelled 4
    now) no longer says."""
    log = "\n".join(["multiworker launcher: starting", WARM, "step 1",
                     COLD.replace("worker 3", "worker 0"), "step 2"])
    assert [(line.generation, line.text[:10]) for line in label_log(log, 0, 4)] == [
        (2, "multiworke"), (2, "==== multi"), (2, "step 1"), (1, "==== multi"), (1, "step 2")]
    assert [line.generation for line in label_log("a\nb", 0, 4)] == [4, 4]  # no header


def test_lines_followed_wait_for_a_launchers_first_header() -> None:
    held = Labeller(0, 4, hold=True)
    assert held.label("multiworker launcher: starting") == []
    assert [(line.generation, line.text[:10]) for line in held.label(WARM)] == [
        (2, "multiworke"), (2, "==== multi")]
    assert [line.generation for line in held.label("step 1")] == [2]
    assert held.flush() == []
    plain = Labeller(0, 4)  # no launcher: no header to wait for
    assert [line.generation for line in plain.label("step 1")] == [4]
    many = Labeller(0, 4, hold=True)
    lines = [line for n in range(HOLD_LIMIT + 1) for line in many.label(f"line {n}")]
    assert len(lines) == HOLD_LIMIT + 1 and {line.generation for line in lines} == {4}


def test_a_line_reads_worker_and_generation() -> None:
    assert str(LogLine(1, 2, "step 40")) == "[worker-1 gen 2] step 40"
    assert str(LogLine(0, None, "x")) == "[worker-0 gen ?] x"
    assert str(LogLine(None, None, "gone")) == "[note] gone"
    labeller = Labeller(3, 0)
    assert labeller.label("2026-11-29T16:00:01Z hello\n") == [LogLine(
        3, 0, "hello", datetime(2026, 11, 29, 16, 0, 1, tzinfo=UTC))]


def pod(worker: int, generation: int, uid: str, restarts: int = 0,
        annotations: dict[str, str] | None = None, state: str = "running") -> Obj:
    """A worker pod as the operator makes it: the in-place agent first, then the trainer."""
    return {"metadata": {"name": f"digits-worker-{worker}", "uid": uid,
                         "labels": {"multiworker.dev/job-name": "digits",
                                    "multiworker.dev/worker-index": str(worker),
                                    "multiworker.dev/group-generation": str(generation)},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "mwj-agent"}, {"name": "tensorflow"}]},
            "status": {"containerStatuses": [
                {"name": "mwj-agent", "restartCount": 0, "state": {"running": {}}},
                {"name": "tensorflow", "restartCount": restarts, "state": {state: {}}}]}}


EXIT = "multiworker.dev/trainer-exit"
RELEASED = "multiworker.dev/released-generation"


@pytest.mark.parametrize(("annotations", "label", "current", "previous"), [
    ({}, 3, 3, 2),
    ({RELEASED: "4"}, 5, 4, 3),  # released is what the container was let run
    ({RELEASED: "4", EXIT: json.dumps({"generation": 1, "exitCode": 137})}, 5, 4, 1),
    ({EXIT: "not json"}, 2, 2, 1),
    ({}, 0, 0, 0),
])
def test_generations_of_a_pods_runs(annotations: dict[str, str], label: int, current: int,
                                    previous: int) -> None:
    found = pod(0, label, "u", annotations=annotations)
    assert (current_generation(found), previous_generation(found)) == (current, previous)


def test_the_trainer_container() -> None:
    assert trainer_container(pod(0, 0, "u")) == "tensorflow"
    named = pod(0, 0, "u", annotations={"multiworker.dev/trainer-container": "main"})
    assert trainer_container(named) == "main"
    assert trainer_container({"spec": {"containers": [{"name": "mwj-gate"},
                                                      {"name": "mwj-agent"}]}}) is None


def test_a_restarted_container_is_two_runs() -> None:
    restarted = pod(1, 2, "u", restarts=1, annotations={RELEASED: "2"})
    assert container_logs(restarted, previous=True) == [
        ContainerLog("digits-worker-1", "u", 1, "tensorflow", True, 1, 1),
        ContainerLog("digits-worker-1", "u", 1, "tensorflow", False, 2, 1)]
    assert [r.previous for r in container_logs(restarted, previous=False)] == [False]
    assert [r.previous for r in container_logs(pod(1, 2, "u"), previous=True)] == [False]
    warm = pod(1, 2, "u", annotations={"multiworker.dev/warm-agent-port": "8472"})
    assert [r.launcher for r in container_logs(warm, previous=True)] == [True]


@pytest.mark.parametrize(("selection", "follow", "line", "wanted"), [
    ("current", False, LogLine(0, 2, "x"), True),
    ("current", False, LogLine(0, 1, "x"), False),
    ("current", False, LogLine(0, 3, "x"), False),
    ("current", True, LogLine(0, 3, "x"), True),  # following: this generation and later
    ("current", True, LogLine(0, 1, "x"), False),
    ("all", False, LogLine(0, 0, "x"), True),
    (1, False, LogLine(0, 1, "x"), True),
    (1, False, LogLine(0, 2, "x"), False),
    ("current", False, LogLine(0, None, "x"), True),  # unknown: shown
    ("current", False, LogLine(None, None, "note"), True),
])
def test_which_lines_are_wanted(selection: Selection, follow: bool, line: LogLine,
                                wanted: bool) -> None:
    assert LogFilter(None, selection, 2, follow).wants(line) is wanted


def test_one_workers_lines() -> None:
    only = LogFilter(1, "all", 2)
    assert only.wants(LogLine(1, 0, "x")) and not only.wants(LogLine(0, 0, "x"))
    assert only.reads_previous and not LogFilter(1, "current", 2).reads_previous


@pytest.mark.parametrize(("selection", "seen", "pods", "said"), [
    ("all", {0, 1, 2}, 2, None),
    ("all", {2, None}, 2, ("no log lines of generations 0, 1 are left in the cluster: a group "
                           "restarted by recreating its pods takes their logs with it")),
    (1, {2}, 2, "no log lines of generation 1 are left"),
    ("all", set(), 0, "no worker pods are left"),
])
def test_what_is_gone_is_said(selection: Selection, seen: set[int | None], pods: int,
                              said: str | None) -> None:
    note = gone_note(LogFilter(None, selection, 2).asked(), seen, pods)
    if said is None:
        assert note is None
    else:
        assert note is not None and note.worker is None and note.text.startswith(said)


# -- through the API

def log_route(current: str, previous: str | Answer | None = None) -> Any:
    def route(request: Request) -> Answer:
        if request.query.get("previous", "").lower() == "true":
            if isinstance(previous, Answer):
                return previous
            return Answer(text=previous or "")
        return Answer(text=current)
    return route


GEN_1 = COLD.replace("worker 3", "worker 0")
NOT_KEPT = status_error(400, "BadRequest", 'previous terminated container "tensorflow" in pod '
                        '"digits-worker-1" not found', kind=None)


def in_place_cluster(api: FakeApi) -> None:
    """Generation 2 now. worker-0: its first container (generation 0, no header) died and was
    restarted cold as generation 1 under the launcher, which then ran generation 2 warm.
    worker-1: restarted too, but the kubelet no longer has its previous log."""
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body(generation=2)))
    api.on("GET", PODS, Answer(body={"metadata": {"resourceVersion": "5"}, "items": [
        pod(1, 2, "b", restarts=1),
        pod(0, 2, "a", restarts=1, annotations={
            RELEASED: "1", EXIT: json.dumps({"generation": 0})})]}))
    api.on("GET", f"{PODS}/digits-worker-0/log", log_route(
        previous="2026-11-29T16:00:01Z g0 step 10\n2026-11-29T16:00:03Z g0 step 20\n",
        current=f"2026-11-29T16:00:59Z {GEN_1}\n2026-11-29T16:01:00Z g1 start\n"
                f"2026-11-29T16:02:00Z {WARM}\n2026-11-29T16:02:01Z g2 step 30\n"))
    api.on("GET", f"{PODS}/digits-worker-1/log", log_route(
        previous=NOT_KEPT, current="2026-11-29T16:00:02Z w1 g2 step 30\n"))


def test_every_generation_merged_in_time_order(api: FakeApi) -> None:
    in_place_cluster(api)
    lines = [str(line) for line in Client().get("digits").logs(generation="all")]
    assert lines == ["[worker-0 gen 0] g0 step 10",
                     "[worker-1 gen 2] w1 g2 step 30",
                     "[worker-0 gen 0] g0 step 20",
                     f"[worker-0 gen 1] {GEN_1}",
                     "[worker-0 gen 1] g1 start",
                     f"[worker-0 gen 2] {WARM}",
                     "[worker-0 gen 2] g2 step 30"]
    asked = api.sent("GET", f"{PODS}/digits-worker-0/log")
    assert {(r.query["container"], r.query.get("previous"), r.query["timestamps"])
            for r in asked} == {("tensorflow", "true", "true"), ("tensorflow", "false", "true")}


def test_the_current_generation_of_one_worker(api: FakeApi) -> None:
    in_place_cluster(api)
    lines = list(Client().get("digits").logs(worker=0))
    assert [line.text for line in lines] == [WARM, "g2 step 30"]
    assert api.sent("GET", PODS)[0].query["labelSelector"] == \
        "multiworker.dev/job-name=digits,multiworker.dev/worker-index=0"
    assert all(r.query.get("previous") != "true"
               for r in api.sent("GET", f"{PODS}/digits-worker-0/log"))


def test_generations_a_recreate_deleted_are_said_to_be_gone(api: FakeApi) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body(generation=1)))
    api.on("GET", PODS, Answer(body={"metadata": {}, "items": [pod(0, 1, "n")]}))
    api.on("GET", f"{PODS}/digits-worker-0/log", log_route("2026-11-29T16:00:02Z g1\n"))
    lines = list(Client().get("digits").logs(generation="all"))
    assert [line.worker for line in lines] == [0, None]
    assert lines[-1].text.startswith("no log lines of generation 0 are left in the cluster")


def test_follow_spans_a_restart_in_place_and_a_recreated_pod(
        api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """worker-0's container is restarted in place (generation 1), and worker-1's pod is
    replaced (generation 1, its trainer under the launcher): one follow streams all three
    runs, then ends with the job."""
    monkeypatch.setattr(logstreams, "POLL_SECONDS", 0.05)
    first = pod(0, 0, "a")
    restarted = pod(0, 1, "a", restarts=1, annotations={RELEASED: "1"})
    replaced = pod(1, 1, "c", annotations={"multiworker.dev/warm-agent-port": "8472"})

    def follows() -> list[Request]:
        return [r for r in api.requests
                if r.path.endswith("/log") and r.query.get("follow") == "true"]

    def job(request: Request) -> Answer:
        done = len(follows()) >= 3
        return Answer(body=job_body(phase="Succeeded" if done else "Running", generation=0))
    api.on("GET", f"{JOBS}/digits", job)
    api.on("GET", PODS, Answer(body={"metadata": {"resourceVersion": "7"},
                                     "items": [first, pod(1, 0, "b", state="waiting")]}))
    api.on("GET", PODS, Answer(lines=[{"type": "MODIFIED", "object": restarted},
                                      {"type": "ADDED", "object": replaced}], pause=0.05),
           Answer(lines=[], pause=0.05), watch=True)
    api.on("GET", f"{PODS}/digits-worker-0/log",
           Answer(lines=["2026-11-29T16:00:01Z gen0 step 10"]),
           Answer(lines=["2026-11-29T16:01:01Z gen1 step 20"]))
    header = COLD.replace("worker 3", "worker 1")
    api.on("GET", f"{PODS}/digits-worker-1/log",
           Answer(lines=["2026-11-29T16:01:01Z multiworker launcher: starting",
                         f"2026-11-29T16:01:01Z {header}",
                         "2026-11-29T16:01:02Z w1 gen1 step 20"]))
    lines = sorted(str(line) for line in Client().get("digits").logs(follow=True))
    assert lines == ["[worker-0 gen 0] gen0 step 10", "[worker-0 gen 1] gen1 step 20",
                     f"[worker-1 gen 1] {header}",
                     "[worker-1 gen 1] multiworker launcher: starting",
                     "[worker-1 gen 1] w1 gen1 step 20"]
    assert len(follows()) == 3  # the waiting pod of generation 0 was never asked
