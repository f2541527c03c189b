"""`run` maps a script's outcome to the contract's exit codes (subprocesses, no TensorFlow)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from multiworker.decide.progress import final_progress
from multiworker.runtime.exits import PEERS_LAST_READ_SECONDS, write_termination_message

SCRIPT = """
import sys
from multiworker import runtime

def main(ctx):
    outcome = sys.argv[1]
    if outcome == "peers":
        raise runtime.PeersUnreachable("peers not resolvable: w-1:2222")
    if outcome == "collective":
        raise runtime.CollectiveAborted("collective aborted (UnavailableError): boom")
    if outcome == "preempted":
        raise runtime.Preempted("SIGTERM on 1 worker(s)")
    if outcome == "superseded":
        raise runtime.Superseded("superseded: generation 3 of this job claimed it")
    if outcome == "bug":
        raise ValueError("a bug in the script")
    print("tensorflow imported:", "tensorflow" in sys.modules)

runtime.run(main)
"""


def run_script(outcome: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, outcome],
        check=False,
        env={"MWJ_PROGRESS_PORT": "0", "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_with_termination_log(script: str, mode: str, tmp_path: Path
                             ) -> subprocess.CompletedProcess[str]:
    """Runs `script` in `mode` with the runtime's termination log at tmp_path/termination-log."""
    script = script.replace("runtime.run(main)", (
        "import multiworker.runtime.exits as exits\n"
        f"exits.TERMINATION_LOG = {str(tmp_path / 'termination-log')!r}\n"
        "runtime.run(main)"))
    (tmp_path / "termination-log").write_text("")
    return subprocess.run([sys.executable, "-c", script, mode], check=False,
                          env={"MWJ_PROGRESS_PORT": "0", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("outcome", "code", "message"),
    [
        ("done", 0, "done"),
        ("peers", 3, "peers not resolvable: w-1:2222 (exit 3)"),
        ("collective", 4, "collective aborted (UnavailableError): boom (exit 4)"),
        ("preempted", 143, "SIGTERM on 1 worker(s) (exit 143)"),
        ("superseded", 5, "WARNING [worker 0/1] superseded: generation 3 of this job claimed it"),
        ("bug", 1, "ValueError: a bug in the script"),
    ],
)
def test_outcome_becomes_the_exit_code(outcome: str, code: int, message: str) -> None:
    result = run_script(outcome)
    assert result.returncode == code, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(("outcome", "lingers"), [
    ("superseded", True), ("preempted", True), ("collective", False), ("peers", False)])
def test_a_worker_leaving_on_its_own_decision_serves_its_peers_a_moment_longer(
    outcome: str, lingers: bool
) -> None:
    """Its peers may still be reading this worker's part of the last all-reduce: a worker that
    left at once closed the socket, and the reader exited 4 instead of 2 (CI). Where a peer
    is gone (3, 4) there is no one to serve."""
    started = time.monotonic()
    run_script(outcome)
    took = time.monotonic() - started
    assert (took >= PEERS_LAST_READ_SECONDS) == lingers, took


def test_bad_configuration_exits_2_listing_every_problem() -> None:
    result = run_script("done", TF_CONFIG="{", MWJ_PROGRESS_PORT="x")
    assert result.returncode == 2
    assert "bad configuration: TF_CONFIG: not valid JSON" in result.stderr
    assert (
        "bad configuration: MWJ_PROGRESS_PORT: 'x' is not an integer" in result.stderr
    )


def test_run_and_config_do_not_import_tensorflow() -> None:
    result = run_script("done")
    assert "tensorflow imported: False" in result.stdout, result.stderr


def test_the_termination_message_is_written_only_where_kubernetes_mounted_it(
    tmp_path: Path,
) -> None:
    mounted = tmp_path / "termination-log"
    mounted.touch()  # the kubelet creates the file; outside Kubernetes there is none
    assert write_termination_message("workers differ: x (exit 2)", str(mounted))
    assert mounted.read_text() == "workers differ: x (exit 2)"
    assert write_termination_message("é" * 5000, str(mounted))
    assert mounted.read_text() == "é" * 2048
    assert not write_termination_message("x", str(tmp_path / "absent"))
    assert not (tmp_path / "absent").exists()


def test_a_worker_that_finishes_leaves_its_final_report_as_its_termination_message(
    tmp_path: Path,
) -> None:
    """The last poll may come before the end (a Succeeded job showed step 220 of 300): the
    worker's own last report goes where the kubelet keeps it, for the operator to read."""
    script = SCRIPT.replace('print("tensorflow imported:"',
                            'ctx.progress.step_done(300, 0.05); ctx.progress.epoch_done(20); '
                            'print("tensorflow imported:"')
    result = run_with_termination_log(script, "done", tmp_path)
    assert result.returncode == 0, result.stderr
    message = (tmp_path / "termination-log").read_text()
    final = final_progress(message)
    assert final is not None, message
    assert (final.step, final.epoch, final.loss) == (300, 20, 0.05)
    assert "peers" not in message and len(message) < 1024


def test_a_superseded_trainer_leaves_its_reason_as_its_termination_message(
    tmp_path: Path,
) -> None:
    result = run_with_termination_log(SCRIPT, "superseded", tmp_path)
    assert result.returncode == 5, result.stderr
    assert (tmp_path / "termination-log").read_text() == (
        "superseded: generation 3 of this job claimed it (exit 5)")
