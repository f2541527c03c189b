"""The preflight: workers that do not run the same software on the same GPUs stop before the
strategy is built, every one with exit 2 and the same message naming the first difference.

Skew is staged by environment, never by mocking TensorFlow: MWJ_TEST_FINGERPRINT_OVERRIDE
changes what one real worker reports, and where this host has a second Python 3.11 of another
patch release, one worker really runs on it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from multiworker.runtime.config import load_config
from multiworker.runtime.errors import ConfigError
from multiworker.runtime.preflight import (
    PASSED,
    PENDING,
    Fingerprint,
    GroupCheck,
    first_mismatch,
    with_override,
)
from multiworker.runtime.reach import Reach

from tests.runtime.workers import REPO, Launcher, Worker, loopback_group
from tests.support import wait_for


def installed_tensorflow() -> str:
    """TensorFlow's version without importing it (the CPU wheel is another distribution)."""
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("TensorFlow is not installed")


TF_VERSION = installed_tensorflow()
CPU = Fingerprint("2.21.0", "3.11.7", "3.15.1", None, None, "0.1.0")
A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(*models: str) -> Fingerprint:
    return Fingerprint("2.21.0", "3.11.7", "3.15.1", "12.5.1", "9", "0.1.0", models)


@pytest.mark.parametrize(
    ("theirs", "expected"),
    [
        (
            Fingerprint("2.20.0", "3.11.7", "3.15.1", None, None, "0.1.0"),
            "worker-2 runs TensorFlow 2.20.0, worker-0 2.21.0",
        ),
        (
            Fingerprint("2.21.0", "3.12.1", "3.15.1", None, None, "0.1.0"),
            "worker-2 runs Python 3.12.1, worker-0 3.11.7",
        ),
        (gpu(), "worker-2 runs CUDA 12.5.1, worker-0 none"),
        (
            Fingerprint("2.21.0", "3.11.7", "3.15.1", None, None, "0.2.0"),
            "worker-2 runs multiworker 0.2.0, worker-0 0.1.0",
        ),
    ],
)
def test_the_first_difference_is_named(theirs: Fingerprint, expected: str) -> None:
    assert first_mismatch(CPU, {1: CPU, 2: theirs}) == expected


def test_gpu_counts_then_models_are_compared() -> None:
    chief = gpu(A100, A100)
    assert first_mismatch(chief, {1: gpu(A100)}) == "worker-1 sees 1 GPU(s), worker-0 2"
    assert first_mismatch(chief, {1: gpu(A100, H100)}) == (
        f"worker-1 has GPUs 1x {A100} + 1x {H100}, worker-0 2x {A100}"
    )
    assert first_mismatch(chief, {1: gpu(A100, A100)}) is None


def test_the_lowest_worker_is_named_and_the_others_counted() -> None:
    old = Fingerprint("2.20.0", "3.11.7", "3.15.1", None, None, "0.1.0")
    assert first_mismatch(CPU, {3: old, 1: None, 2: CPU}) == (
        "worker-1 serves no /preflight (an older multiworker runtime), worker-0 runs "
        "multiworker 0.1.0 (and 1 more worker(s) differ from worker-0)"
    )


def test_a_fingerprint_survives_its_json_and_the_override() -> None:
    fingerprint = gpu(H100, A100)
    document = json.loads(json.dumps(fingerprint.to_json()))
    assert document["devices"] == {"gpuCount": 2, "gpuModels": [A100, H100]}
    assert Fingerprint.from_json(document) == fingerprint
    changed = with_override(fingerprint, '{"tensorflow": "2.20.0", "gpuModels": []}')
    assert (changed.tensorflow, changed.gpu_models, changed.python) == ("2.20.0", (), "3.11.7")
    for bad in ("[1]", '{"tensorflow": 2}', '{"gpus": 1}', "{"):
        with pytest.raises(ConfigError, match="MWJ_TEST_FINGERPRINT_OVERRIDE: "):
            with_override(fingerprint, bad)


def test_worker_0_records_who_has_seen_its_verdict() -> None:
    config = load_config(
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
            ),
            "MWJ_RESTART_COUNT": "4",
        }
    )
    check = GroupCheck(config, CPU)
    asked = {"worker": ["1"], "generation": ["4"]}
    assert check.document(asked)["verdict"] == PENDING
    assert check.seen_by(1)[0] is Reach.NOT_READY  # a pending verdict is not a verdict

    stale = {"workerIndex": 1, "generation": 3, "fingerprint": CPU.to_json()}
    assert check.take_report(1, stale) == (
        Reach.NOT_READY,
        "answers as worker-1 of generation 3, not worker-1 of generation 4",
    )
    assert check.take_report(1, {**stale, "generation": 4})[0] is Reach.READY
    assert check.decide() is None
    assert check.document({"worker": ["1"], "generation": ["3"]})["verdict"] == PASSED
    assert check.seen_by(1)[0] is Reach.NOT_READY  # asked as another generation
    check.document(asked)
    assert check.seen_by(1) == (Reach.READY, "fetched the verdict")


@pytest.mark.timeout(120)
def test_a_skewed_worker_stops_the_whole_group_with_exit_2(launcher: Launcher) -> None:
    override = {"MWJ_TEST_FINGERPRINT_OVERRIDE": '{"tensorflow": "2.20.0"}'}
    peers, ports = loopback_group(3)
    group: dict[str, Any] = {"peers": peers, "progress_ports": ports}
    workers = launcher.start(3, only=(0, 1), **group)
    workers += launcher.start(3, only=(2,), env=override, **group)

    codes = [w.wait(timeout=90) for w in workers]

    assert codes == [2, 2, 2], launcher.logs()
    message = f"workers differ: worker-2 runs TensorFlow 2.20.0, worker-0 {TF_VERSION}"
    for worker in workers:
        assert f"bad worker configuration: {message} (exit 2)" in last_line(worker)


@pytest.mark.timeout(120)
def test_a_matching_group_passes_and_reports_its_software(launcher: Launcher) -> None:
    args = ("--epochs", "1", "--steps-per-epoch", "5", "--target-loss", "1000")
    workers = launcher.start(2, args=args)
    verdict = wait_for(
        lambda: (workers[0].progress(path="/preflight") or {}).get("verdict") == PASSED
        or None,
        timeout=90,
        interval=0.2,
        describe=launcher.logs,
    )
    software = wait_for(lambda: (workers[1].progress() or {}).get("software"), timeout=30)

    assert [w.wait(timeout=90) for w in workers] == [0, 0], launcher.logs()
    assert verdict
    assert software["tensorflow"] == TF_VERSION
    assert software["python"] == platform.python_version()
    assert "preflight passed" in workers[1].log()


@pytest.mark.timeout(120)
def test_a_worker_0_without_preflight_stops_the_others(launcher: Launcher) -> None:
    """An older runtime on worker 0 (its progress server knows no /preflight): the others
    name it instead of waiting for a verdict that never comes."""
    peers, ports = loopback_group(2)
    with old_runtime() as port:
        (follower,) = launcher.start(
            2, only=(1,), peers=peers, progress_ports=[port, ports[1]]
        )
        assert follower.wait(timeout=90) == 2, launcher.logs()
    assert (
        "workers differ: worker-0 serves no /preflight (an older multiworker runtime), "
        "worker-1 runs multiworker 0.1.0 (exit 2)" in last_line(follower)
    )


@pytest.mark.timeout(150)
def test_a_worker_on_another_python_release_is_named(launcher: Launcher) -> None:
    """Real skew, no override: one worker runs this host's other Python 3.11 interpreter on
    the same site-packages (TensorFlow's wheels are built for any 3.11)."""
    other = other_python()
    if other is None:
        pytest.skip("no second Python 3.11 of another patch release on this host")
    python, version = other
    peers, ports = loopback_group(2)
    group: dict[str, Any] = {"peers": peers, "progress_ports": ports}
    workers = launcher.start(2, only=(0,), **group)
    workers += launcher.start(
        2,
        only=(1,),
        **group,
        python=python,
        env={"PYTHONPATH": os.pathsep.join([str(REPO / "operator" / "src"), *site_dirs()])},
    )

    assert [w.wait(timeout=120) for w in workers] == [2, 2], launcher.logs()
    message = f"worker-1 runs Python {version}, worker-0 {platform.python_version()}"
    for worker in workers:
        assert message in last_line(worker)


def last_line(worker: Worker) -> str:
    lines = worker.log().strip().splitlines()
    return lines[-1] if lines else ""


def site_dirs() -> list[str]:
    return [p for p in sys.path if p.endswith("site-packages")]


def other_python() -> tuple[str, str] | None:
    """Another python3.11 on PATH or in /usr/bin whose patch release differs from ours."""
    ours = platform.python_version()
    candidates = {shutil.which("python3.11"), "/usr/bin/python3.11", "/usr/local/bin/python3.11"}
    for path in sorted(c for c in candidates if c and os.path.exists(c)):
        found = subprocess.run(
            [path, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if found.startswith("3.11.") and found != ours:
            return path, found
    return None


@contextlib.contextmanager
def old_runtime() -> Iterator[int]:
    """A progress server from before the preflight: /progress only, 404 for the rest."""
    server = HTTPServer(("127.0.0.1", 0), _OldRuntime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class _OldRuntime(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/progress"
        body = b'{"phase": "waiting-for-peers"}' if found else b"{}"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""
