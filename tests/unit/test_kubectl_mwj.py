"""`kubectl mwj`: durations, the status summary and history table, the exit codes a script
relies on, and every command against the fake API server (test_client_http.py): one line on
stderr for each error, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from multiworker.api.status import GenerationRecord, JobStatus
from multiworker.client import (
    ApiError,
    ClientError,
    ClusterUnreachable,
    InvalidJob,
    JobFailed,
    JobNotFound,
    WaitTimeout,
)
from multiworker.client.plugin import exit_code, main, pairs
from multiworker.client.render import (
    history_table,
    jobs_table,
    parse_duration,
    short_duration,
    status_lines,
)

from tests.unit.test_client_http import (
    CLAIMS,
    FAILED,
    HISTORY,
    JOBS,
    NAMESPACE,
    PODS,
    Answer,
    FakeApi,
    closed_port,
    created,
    event,
    job_body,
    job_list,
    kubeconfig,
    status_error,
)

NOW = datetime(2026, 11, 29, 16, 10, tzinfo=UTC)
FINISHED: dict[str, Any] = {
    "phase": "Succeeded", "groupGeneration": 1, "ready": "0/2", "restarts": 1,
    "disruptions": 0, "startTime": "2026-11-29T16:00:00Z",
    "completionTime": "2026-11-29T16:02:00Z",
    "progress": {"step": 200, "epoch": 20, "loss": 0.0812345, "accuracy": 0.9611,
                 "stepsPerSecond": 9.87, "resumedFromStep": 100, "resumedFrom": "checkpoint",
                 "updatedAt": "2026-11-29T16:01:59Z"},
    "lastFailure": {"worker": 0, "generation": 0, "reason": "Error", "exitCode": 137,
                    "message": "killed\nby signal", "time": "2026-11-29T16:01:02Z",
                    "action": "RestartGroup", "lastStep": 140, "stepsLost": 40},
    "conditions": [{"type": "Succeeded", "status": "True", "reason": "ChiefSucceeded",
                    "message": "worker-0 exited 0",
                    "lastTransitionTime": "2026-11-29T16:02:00Z"}],
    "history": HISTORY}


@pytest.mark.parametrize(("text", "seconds"), [
    ("600", 600), ("600s", 600), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), (" 2m ", 120),
    ("1h0m5s", 3605),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "m", "1h30", "-5", "ten"])
def test_not_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (42.9, "42s"), (192, "3m12s"), (180, "3m"), (7500, "2h5m"),
    (3 * 86400 + 4 * 3600 + 5, "3d4h"), (-5, "0s"),
])
def test_short_durations(seconds: float, text: str) -> None:
    assert short_duration(seconds) == text


def test_the_history_table() -> None:
    records = [GenerationRecord.model_validate(r) for r in HISTORY]
    records.append(GenerationRecord.model_validate(
        {"generation": 2, "workers": 1, "path": "Recreate", "started": "2026-11-29T16:09:00Z"}))
    assert history_table(records, NOW) == [
        "GEN  WORKERS  PATH            STARTED    RUNNING  ENDED  REASON          RESUMED  LOST",
        "0    2        Created         10m ago    +12s     +1m3s  WorkerFailed    0        40",
        "1    2        InPlace (warm)  8m57s ago  +2s      +57s   ChiefSucceeded  100      -",
        "2    1        Recreate        1m ago     -        -      -               -        -"]


def test_the_status_summary_says_every_fact_of_the_status() -> None:
    assert status_lines("team/digits", JobStatus.model_validate(FINISHED), NOW) == [
        "Job:          team/digits",
        "Phase:        Succeeded (generation 1, ready 0/2)",
        "Restarts:     1 (disruptions 0)",
        "Started:      10m ago, finished 8m ago",
        ("Progress:     step 200, epoch 20, loss 0.08123, accuracy 0.9611, 9.87 steps/s, "
         "resumed from step 100 (checkpoint), updated 8m1s ago"),
        ("Last failure: worker-0 exited 137 (Error) in generation 0, 8m58s ago; RestartGroup: "
         "killed by signal"),
        "              last step 140, 40 steps lost",
        "Conditions:",
        "  TYPE       STATUS  REASON          SINCE   MESSAGE",
        "  Succeeded  True    ChiefSucceeded  8m ago  worker-0 exited 0",
        "History:",
        "  GEN  WORKERS  PATH            STARTED    RUNNING  ENDED  REASON          RESUMED  LOST",
        "  0    2        Created         10m ago    +12s     +1m3s  WorkerFailed    0        40",
        "  1    2        InPlace (warm)  8m57s ago  +2s      +57s   ChiefSucceeded  100      -"]
    assert status_lines("t/new", JobStatus(), NOW) == [
        "Job:          t/new", "Phase:        Pending (generation 0, ready -)",
        "Restarts:     0 (disruptions 0)"]


def test_the_jobs_table() -> None:
    rows = [("digits", JobStatus.model_validate(FINISHED),
             datetime(2026, 11, 29, 15, 59, 58, tzinfo=UTC)), ("new", JobStatus(), None)]
    assert jobs_table(rows, NOW) == [
        "NAME    PHASE      GEN  READY  RESTARTS  STEP  AGE",
        "digits  Succeeded  1    0/2    1         200   10m2s",
        "new     Pending    0    -      0         -     -"]


@pytest.mark.parametrize(("error", "code"), [
    (JobFailed("x", "R", "m", None), 1),
    (InvalidJob("x"), 2),
    (JobNotFound("x"), 3),
    (WaitTimeout("x"), 4),
    (ClusterUnreachable("x"), 5),
    (ApiError("x", 403), 5),
    (ClientError("x"), 5),
    (FileNotFoundError(2, "No such file", "job.yaml"), 2),
    (yaml.YAMLError("x"), 2),
    (ValueError("x"), 2),
    (RuntimeError("x"), 5),
])
def test_exit_codes(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


def test_pairs() -> None:
    assert pairs(["A=1", "B=x=y", "C="], "--env") == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="--env 'A': write KEY=VALUE"):
        pairs(["A"], "--env")


# -- the commands, against the fake API server

def mwj(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_status_prints_the_summary_and_json_the_status_itself(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body(**FINISHED)))
    code, out, _ = mwj(capsys, "status", "digits")
    assert code == 0
    assert "Phase:        Succeeded (generation 1, ready 0/2)" in out
    assert any(line.split()[:3] == ["0", "2", "Created"] for line in out.splitlines())
    code, out, _ = mwj(capsys, "status", "digits", "-o", "json")
    assert code == 0 and json.loads(out) == job_body(**FINISHED)["status"]
    code, out, _ = mwj(capsys, "status", "digits", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == job_body(**FINISHED)["status"]


def test_list(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", JOBS, job_list(job_body("a", **FINISHED), job_body("b", phase=None)))
    code, out, _ = mwj(capsys, "list")
    assert code == 0 and [line.split()[:2] for line in out.splitlines()] == [
        ["NAME", "PHASE"], ["a", "Succeeded"], ["b", "Pending"]]
    code, out, _ = mwj(capsys, "list", "-o", "json")
    assert [j["metadata"]["name"] for j in json.loads(out)["items"]] == ["a", "b"]


def test_list_every_namespace(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    other = job_body("c", **FINISHED)
    other["metadata"]["namespace"] = "team-b"
    api.on("GET", "/apis/multiworker.dev/v1alpha1/multiworkerjobs",
           job_list(job_body("a", **FINISHED), other))
    code, out, _ = mwj(capsys, "list", "-A")
    assert code == 0 and [line.split()[:3] for line in out.splitlines()] == [
        ["NAMESPACE", "NAME", "PHASE"], [NAMESPACE, "a", "Succeeded"],
        ["team-b", "c", "Succeeded"]]


def test_logs_all_labels_lines_and_notes_what_is_gone(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body(generation=1)))
    api.on("GET", PODS, Answer(body={"metadata": {}, "items": [
        {"metadata": {"name": "digits-worker-0", "uid": "u", "labels": {
            "multiworker.dev/worker-index": "0", "multiworker.dev/group-generation": "1"}},
         "spec": {"containers": [{"name": "tensorflow"}]}, "status": {}}]}))
    api.on("GET", f"{PODS}/digits-worker-0/log",
           Answer(text="2026-11-29T16:00:00Z hello\n"))
    code, out, err = mwj(capsys, "logs", "digits", "--all")
    assert (code, out) == (0, "[worker-0 gen 1] hello\n")
    assert err.startswith("note: no log lines of generation 0 are left in the cluster")


def test_wait_exits_0_1_or_4(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", f"{JOBS}/digits", Answer(body=job_body()))
    api.on("GET", JOBS, job_list(job_body()))
    api.on("GET", JOBS, Answer(lines=[event("MODIFIED", job_body(phase="Succeeded"))]),
           Answer(lines=[event("MODIFIED", job_body(phase="Failed", **FAILED))]),
           Answer(lines=[], pause=0.05), watch=True)
    assert mwj(capsys, "wait", "digits")[:2] == (0, "job digits Succeeded\n")
    code, _, err = mwj(capsys, "wait", "digits", "--for", "Succeeded")
    assert code == 1 and one_error_line(err).startswith(
        "error: job digits failed: RestartLimitExceeded: worker-1 exited 1 (Error)")
    code, _, err = mwj(capsys, "wait", "digits", "--timeout", "0.3s")
    assert code == 4 and "was not Succeeded after 0.3s" in one_error_line(err)


def test_submit_from_a_file_waits_for_the_end(
        api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_body(phase=None)))
    api.on("POST", JOBS, created)
    api.on("GET", JOBS, job_list(job_body()))
    api.on("GET", JOBS, Answer(lines=[event("MODIFIED", job_body(phase="Succeeded"))]),
           watch=True)
    code, out, _ = mwj(capsys, "submit", "-f", str(path), "--workers", "1", "--env", "A=1",
                       "--wait")
    assert (code, out) == (0, "job team/digits created\njob digits Succeeded\n")
    assert api.sent("POST", JOBS)[0].body["spec"]["workers"] == 1


@pytest.mark.parametrize(("argv", "said"), [
    (["submit", "--name", "x"], "submit needs -f FILE, or --name, --image and --command"),
    (["wait", "x", "--for", "Done"], "argument --for: invalid choice: 'Done'"),
    (["logs", "x", "--all", "--generation", "1"], "not allowed with argument --all"),
    (["submit", "-f", "no-such-file.yaml"], "manifest no-such-file.yaml: No such file"),
    (["submit", "--name", "x", "--image", "i", "--env", "novalue", "--command", "true"],
     "--env 'novalue': write KEY=VALUE"),
    (["submit", "--name", "x", "--image", "i", "--workers", "0", "--command", "true"],
     "spec.workers: Input should be greater than or equal to 1"),
])
def test_usage_and_bad_input_exit_2_with_one_line(
        api: FakeApi, capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    code, _, err = mwj(capsys, *argv)
    assert code == 2 and said in one_error_line(err)


def test_a_missing_claim_or_an_unknown_field_exits_2(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", f"{CLAIMS}/gone", status_error(404, "NotFound", "not found",
                                                 "persistentvolumeclaims"))
    code, _, err = mwj(capsys, "submit", "--name", "x", "--image", "i", "--claim", "gone",
                       "--command", "true")
    assert code == 2 and "PersistentVolumeClaim 'gone' does not exist" in one_error_line(err)
    api.on("POST", JOBS, status_error(
        400, "BadRequest", 'MultiWorkerJob in version "v1alpha1" cannot be handled as a '
        'MultiWorkerJob: strict decoding error: unknown field "spec.wrokers"'))
    code, _, err = mwj(capsys, "submit", "--name", "x", "--image", "i", "--command", "true")
    assert code == 2 and 'unknown field "spec.wrokers"' in one_error_line(err)


def test_a_job_not_found_exits_3(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("DELETE", f"{JOBS}/gone", status_error(404, "NotFound", "not found"))
    api.on("GET", f"{JOBS}/gone", status_error(404, "NotFound", "not found"))
    code, _, err = mwj(capsys, "delete", "gone")
    assert code == 3 and one_error_line(err) == "error: job team/gone not found"
    code, _, err = mwj(capsys, "status", "gone", "-o", "json")
    assert code == 3 and one_error_line(err) == "error: job team/gone not found"


def test_no_crd_exits_5(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = mwj(capsys, "list")  # the fake knows no path: the API is not there
    assert code == 5 and "the MultiWorkerJob API (multiworkerjobs.multiworker.dev) is not " \
                         "installed" in one_error_line(err)


def test_suspend_and_resume(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("PATCH", f"{JOBS}/digits", Answer(body=job_body()))
    assert mwj(capsys, "suspend", "digits")[:2] == (0, "job digits suspended\n")
    assert mwj(capsys, "resume", "digits", "-n", "team")[:2] == (0, "job digits resumed\n")
    assert [r.body for r in api.sent("PATCH", f"{JOBS}/digits")] == [
        {"spec": {"suspend": True}}, {"spec": {"suspend": False}}]


def test_an_unreachable_cluster_exits_5_with_one_line(tmp_path: Path) -> None:
    """The installed console script, as kubectl runs it: no traceback, whatever urllib3 says."""
    config = kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{closed_port()}")
    script = Path(sys.executable).parent / "kubectl-mwj"
    command = [str(script)] if script.exists() else [
        sys.executable, "-c",
        "import sys; from multiworker.client.plugin import main; sys.exit(main())"]
    proc = subprocess.run([*command, "list"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": str(config)}, check=False)
    assert proc.returncode == 5, proc.stderr
    assert one_error_line(proc.stderr).startswith("error: cannot reach the cluster at "
                                                  "http://127.0.0.1:")
    assert "connection refused" in proc.stderr and "Traceback" not in proc.stderr


def test_help_says_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for line in ("0  success", "1  the job Failed", "2  usage or bad input",
                 "3  the job was not found", "4  timed out waiting",
                 "5  the cluster could not be reached"):
        assert line in out
