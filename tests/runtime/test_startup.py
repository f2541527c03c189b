"""Start-up failures end with the contract's exit codes and say what is wrong."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.runtime.workers import Launcher, loopback_group

pytestmark = pytest.mark.timeout(90)


def test_malformed_tf_config_exits_2_naming_the_problems(launcher: Launcher) -> None:
    (bad_json,) = launcher.start(2, only=(0,), env={"TF_CONFIG": '{"cluster": '})
    peers = ["localhost:1", "localhost:2"]
    (out_of_range,) = launcher.start(
        2,
        peers=peers,
        only=(1,),
        env={"MWJ_NUM_WORKERS": "3", "MWJ_WORKER_INDEX": "5"},
        generation=0,
    )

    assert bad_json.wait(timeout=60) == 2
    assert "bad configuration: TF_CONFIG: not valid JSON" in bad_json.log()
    assert out_of_range.wait(timeout=60) == 2
    log = out_of_range.log()
    assert (
        "MWJ_NUM_WORKERS: 3 does not match the 2 workers in TF_CONFIG.cluster.worker"
        in log
    )
    assert "MWJ_WORKER_INDEX: 5 does not match TF_CONFIG.task.index 1" in log


def test_unreachable_peers_exit_3_within_the_peer_timeout(launcher: Launcher) -> None:
    """Worker 0 alone: worker 1's progress port never answers its preflight. Worker 1 alone:
    worker 0's ports never open. A peer whose name never resolves: named as such."""
    timeout, env = 5.0, {"MWJ_PEER_TIMEOUT_SECONDS": "5"}
    peers, ports = loopback_group(2)
    (alone_as_0,) = launcher.start(2, peers=peers, only=(0,), env=env, progress_ports=ports)
    silent_peers, leader_ports = loopback_group(2)
    (alone_as_1,) = launcher.start(
        2, peers=silent_peers, only=(1,), env=env, generation=1, progress_ports=leader_ports
    )
    unnamed = "no-such-worker.invalid:2222"
    named, unnamed_ports = loopback_group(2)
    peers = [named[0], unnamed]
    (no_name,) = launcher.start(
        2, peers=peers, only=(0,), env=env, generation=2, progress_ports=unnamed_ports
    )

    for worker in (alone_as_0, alone_as_1, no_name):
        assert worker.wait(timeout=60) == 3, worker.log()
        waited = waiting_seconds(worker.log())
        assert timeout <= waited <= timeout + 10, worker.log()
    prefix = "peers not reachable after 5s (MWJ_PEER_TIMEOUT_SECONDS): "
    refused = "connection refused (not listening yet)"
    assert (
        f"{prefix}worker-1 (localhost:{ports[1]}, progress port): {refused} (exit 3)"
        in alone_as_0.log()
    )
    assert (
        f"{prefix}worker-0 (localhost:{leader_ports[0]}, progress port): {refused}; "
        f"worker-0 ({silent_peers[0]}, TensorFlow port): {refused} (exit 3)" in alone_as_1.log()
    )
    assert (
        f"{prefix}worker-1 (no-such-worker.invalid:{unnamed_ports[1]}, progress port): "
        "name does not resolve" in no_name.log()
    )


def waiting_seconds(log: str) -> float:
    """From the config line (start of the wait) to the exit line, by the log's timestamps."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in log.splitlines()
        if "[worker" in line and ("job runtime-test" in line or "(exit 3)" in line)
    ]
    return (stamps[-1] - stamps[0]).total_seconds()
