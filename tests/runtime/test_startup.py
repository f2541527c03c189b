"""Start-up failures end with the contract's exit codes and say what is wrong."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.runtime.workers import Launcher, free_port

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
    """Worker 0 alone: the registration barrier times out. Worker 1 alone: worker 0's port
    never opens. A peer whose name never resolves: the DNS wait times out."""
    timeout, env = 5.0, {"MWJ_PEER_TIMEOUT_SECONDS": "5"}
    leader, follower = f"localhost:{free_port()}", f"localhost:{free_port()}"
    (alone_as_0,) = launcher.start(2, peers=[leader, follower], only=(0,), env=env)
    silent_leader = f"localhost:{free_port()}"
    peers = [silent_leader, f"localhost:{free_port()}"]
    (alone_as_1,) = launcher.start(2, peers=peers, only=(1,), env=env, generation=1)
    unnamed = "no-such-worker.invalid:2222"
    peers = [f"localhost:{free_port()}", unnamed]
    (no_name,) = launcher.start(2, peers=peers, only=(0,), env=env, generation=2)

    for worker in (alone_as_0, alone_as_1, no_name):
        assert worker.wait(timeout=60) == 3, worker.log()
        waited = waiting_seconds(worker.log())
        assert timeout <= waited <= timeout + 10, worker.log()
    assert (
        "group did not form within 5s (MWJ_PEER_TIMEOUT_SECONDS); "
        f"missing: worker 1 ({follower})" in alone_as_0.log()
    )
    assert (
        f"peers not accepting connections after 5s (MWJ_PEER_TIMEOUT_SECONDS): {silent_leader}"
        in alone_as_1.log()
    )
    assert (
        f"peers not resolvable after 5s (MWJ_PEER_TIMEOUT_SECONDS): {unnamed}"
        in no_name.log()
    )


def waiting_seconds(log: str) -> float:
    """From the config line (start of the wait) to the exit line, by the log's timestamps."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in log.splitlines()
        if "[worker" in line and ("job runtime-test" in line or "(exit 3)" in line)
    ]
    return (stamps[-1] - stamps[0]).total_seconds()
