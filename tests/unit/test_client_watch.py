"""Waiting on a job and following its progress: the client's watch (a list, then a watch
from its resourceVersion, listed again when it ends or expires) against the fake API server
(test_client_http.py)."""

from __future__ import annotations

import io
import time

import pytest
from multiworker.client import Client, JobFailed, JobNotFound, WaitTimeout

from tests.unit.test_client_http import (
    FAILED,
    HISTORY,
    JOBS,
    Answer,
    FakeApi,
    Obj,
    event,
    job_body,
    job_list,
)


def watched(api: FakeApi, listed: Obj, *streams: Answer) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=listed))
    api.on("GET", JOBS, job_list(listed))
    api.on("GET", JOBS, *streams, watch=True)


def test_wait_follows_the_watch_until_succeeded(api: FakeApi) -> None:
    watched(api, job_body(), Answer(lines=[
        event("MODIFIED", job_body(progress={"step": 40})),
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "120"}}},
        event("MODIFIED", job_body(phase="Succeeded", generation=1, history=HISTORY))]))
    status = Client().get("digits").wait(timeout=10)
    assert (status.phase, status.group_generation, len(status.history or [])) == \
        ("Succeeded", 1, 2)
    (watch,) = [r for r in api.sent("GET", JOBS) if r.query.get("watch")]
    assert watch.query["fieldSelector"] == "metadata.name=digits"
    assert watch.query["resourceVersion"] == "100"


def test_a_failed_job_raises_with_its_reason_and_last_failure(api: FakeApi) -> None:
    watched(api, job_body(), Answer(lines=[event("MODIFIED", job_body(phase="Failed", **FAILED))]))
    with pytest.raises(JobFailed) as caught:
        Client().get("digits").wait()
    failed = caught.value
    assert (failed.reason, failed.last_failure and failed.last_failure["exitCode"]) == \
        ("RestartLimitExceeded", 1)
    assert str(failed) == ("job digits failed: RestartLimitExceeded: worker-1 exited 1 (Error); "
                           "no restarts left (3 of 3) (last failure: worker-1 exited 1 (Error) "
                           "in generation 3)")
    assert Client().get("digits").wait(until=["Failed", "Succeeded"]).phase == "Failed"


def test_an_expired_watch_is_listed_again(api: FakeApi) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body()))
    api.on("GET", JOBS, job_list(job_body()), job_list(job_body(phase="Succeeded")))
    api.on("GET", JOBS, Answer(lines=[gone]), watch=True)
    assert Client().get("digits").wait(timeout=10).phase == "Succeeded"


def test_a_deleted_job_ends_the_wait(api: FakeApi) -> None:
    watched(api, job_body(), Answer(lines=[event("DELETED", job_body())]))
    with pytest.raises(JobNotFound, match="was deleted"):
        Client().get("digits").wait()


def test_a_wait_times_out(api: FakeApi) -> None:
    watched(api, job_body(), Answer(lines=[], pause=0.05))
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"was not Succeeded after 0.5s \(phase Running\)"):
        Client().get("digits").wait(timeout=0.5)
    assert time.monotonic() - started < 5


def test_progress_yields_each_change_and_ends_with_the_job(api: FakeApi) -> None:
    running = job_body(progress={"step": 40, "epoch": 1, "loss": 0.5,
                                 "updatedAt": "2026-11-29T16:00:40Z"})
    watched(api, job_body(), Answer(lines=[
        event("MODIFIED", running), event("MODIFIED", running),  # no change: no update
        event("MODIFIED", job_body(phase="Restarting", generation=1, ready="0/2")),
        event("MODIFIED", job_body(phase="Succeeded", generation=1))]))
    updates = list(Client().get("digits").progress(timeout=10))
    assert [(u.phase, u.generation, u.step) for u in updates] == [
        ("Running", 0, None), ("Running", 0, 40), ("Restarting", 1, None), ("Succeeded", 1, None)]
    assert str(updates[1]) == "Running  gen 0  ready 2/2  step 40  epoch 1  loss 0.5"


def test_follow_prints_lines_without_tqdm_and_returns_the_final_status(
        api: FakeApi) -> None:
    watched(api, job_body(), Answer(lines=[event("MODIFIED", job_body(phase="Failed", **FAILED))]))
    out = io.StringIO()
    status = Client().get("digits").follow(progress_bar=False, out=out)
    assert status.phase == "Failed"
    assert out.getvalue().splitlines() == ["Running  gen 0  ready 2/2", "Failed  gen 0  ready 2/2"]
