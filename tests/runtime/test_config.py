"""Config parsing: the operator's environment in, a typed config or every problem out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from multiworker.api.contract import (
    DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
    DEFAULT_PEER_TIMEOUT_SECONDS,
)
from multiworker.api.spec import HealthSpec
from multiworker.runtime.config import RuntimeConfig, load_config
from multiworker.runtime.errors import ConfigError

PEERS = ["job-worker-0.job.ns.svc:2222", "job-worker-1.job.ns.svc:2222"]


def env(**overrides: str | None) -> dict[str, str]:
    """A valid environment for worker 1 of 2; None removes a variable."""
    base: dict[str, str | None] = {
        "TF_CONFIG": tf_config(PEERS, 1),
        "MWJ_JOB_NAME": "job",
        "MWJ_NUM_WORKERS": "2",
        "MWJ_WORKER_INDEX": "1",
        "MWJ_RESTART_COUNT": "3",
        "MWJ_CHECKPOINT_DIR": "/checkpoints",
        "MWJ_PROGRESS_PORT": "8471",
        "MWJ_PEER_TIMEOUT_SECONDS": "120",
        "MWJ_COLLECTIVE_TIMEOUT_SECONDS": "30.5",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def tf_config(workers: object, index: object, task_type: object = "worker") -> str:
    return json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": task_type, "index": index}}
    )


def problems(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_config(environ)
    return error.value.problems


def test_operator_environment_parses_into_the_config() -> None:
    assert load_config(env()) == RuntimeConfig(
        job_name="job",
        worker_index=1,
        peers=tuple(PEERS),
        restart_count=3,
        checkpoint_dir="/checkpoints",
        progress_port=8471,
        peer_timeout_seconds=120.0,
        collective_timeout_seconds=30.5,
    )


def test_no_tf_config_means_a_standalone_run_with_defaults() -> None:
    config = load_config({})
    assert config.is_standalone and config.is_chief and config.num_workers == 1
    assert (config.worker_index, config.checkpoint_dir, config.progress_port) == (
        0,
        None,
        8471,
    )


def test_optional_variables_default() -> None:
    config = load_config(
        env(
            MWJ_RESTART_COUNT=None,
            MWJ_CHECKPOINT_DIR=None,
            MWJ_PROGRESS_PORT=None,
            MWJ_PEER_TIMEOUT_SECONDS=None,
            MWJ_COLLECTIVE_TIMEOUT_SECONDS=None,
            MWJ_NUM_WORKERS=None,
            MWJ_WORKER_INDEX=None,
        )
    )
    assert (config.restart_count, config.checkpoint_dir, config.progress_port) == (
        0,
        None,
        8471,
    )
    assert (config.peer_timeout_seconds, config.collective_timeout_seconds) == (
        DEFAULT_PEER_TIMEOUT_SECONDS,
        DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
    )
    assert config.progress_port_of(0) == config.progress_port_of(1) == 8471


def test_runtime_and_api_default_the_timeouts_alike() -> None:
    """One default each, in multiworker.api.contract; the operator's API must agree."""
    health = HealthSpec()
    assert health.peer_timeout_seconds == DEFAULT_PEER_TIMEOUT_SECONDS
    assert health.collective_timeout_seconds == DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    assert health.progress_port == load_config({}).progress_port


def test_progress_ports_of_a_group_on_one_host() -> None:
    config = load_config(env(MWJ_PROGRESS_PORT=None, MWJ_PROGRESS_PORTS="9001,9002"))
    assert config.progress_port == 9002
    assert [config.progress_port_of(i) for i in range(2)] == [9001, 9002]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"MWJ_PROGRESS_PORTS": "9001"}, "MWJ_PROGRESS_PORTS: '9001' must list 2 ports"),
        ({"MWJ_PROGRESS_PORTS": "9001,x"}, "MWJ_PROGRESS_PORTS: '9001,x' is not a comma"),
        ({"MWJ_PROGRESS_PORTS": "9001,0"}, "MWJ_PROGRESS_PORTS: '9001,0' must list 2 ports"),
        (
            {"MWJ_PROGRESS_PORTS": "9001,9002"},
            "MWJ_PROGRESS_PORTS: lists 9002 for this worker, but MWJ_PROGRESS_PORT=8471",
        ),
        (
            {"MWJ_PROGRESS_PORTS": "9001", "TF_CONFIG": None},
            "MWJ_PROGRESS_PORTS: set, but TF_CONFIG is missing",
        ),
    ],
)
def test_malformed_progress_ports_are_rejected(
    overrides: dict[str, str | None], expected: str
) -> None:
    assert any(p.startswith(expected) for p in problems(env(**overrides))), problems(
        env(**overrides)
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"TF_CONFIG": "{not json"},
            "TF_CONFIG: not valid JSON (Expecting property name",
        ),
        ({"TF_CONFIG": "[1, 2]"}, "TF_CONFIG: must be a JSON object, got list"),
        (
            {"TF_CONFIG": '{"task": {"type": "worker", "index": 0}}'},
            "TF_CONFIG.cluster: missing",
        ),
        (
            {"TF_CONFIG": tf_config([], 0)},
            "TF_CONFIG.cluster.worker: missing or not a non-empty",
        ),
        (
            {"TF_CONFIG": tf_config(PEERS, 1, "chief")},
            "TF_CONFIG.task.type: must be 'worker', got 'chief'",
        ),
        (
            {"TF_CONFIG": tf_config(PEERS, "1")},
            "TF_CONFIG.task.index: must be an integer, got '1'",
        ),
        (
            {"TF_CONFIG": tf_config(PEERS, 2)},
            "TF_CONFIG.task.index: 2 is out of range for 2 workers (0..1)",
        ),
        (
            {"TF_CONFIG": tf_config(["a:1", "b"], 1)},
            "TF_CONFIG.cluster.worker[1]: 'b' is not 'host:port'",
        ),
        (
            {"TF_CONFIG": tf_config(["a:1", "a:1"], 1)},
            "TF_CONFIG.cluster.worker: duplicate addresses a:1",
        ),
        (
            {"TF_CONFIG": None, "MWJ_NUM_WORKERS": "2"},
            "TF_CONFIG: missing, but MWJ_NUM_WORKERS=2",
        ),
        (
            {"MWJ_NUM_WORKERS": "3"},
            "MWJ_NUM_WORKERS: 3 does not match the 2 workers in TF_CONFIG",
        ),
        ({"MWJ_NUM_WORKERS": "two"}, "MWJ_NUM_WORKERS: 'two' is not an integer"),
        (
            {"MWJ_WORKER_INDEX": "0"},
            "MWJ_WORKER_INDEX: 0 does not match TF_CONFIG.task.index 1",
        ),
        ({"MWJ_RESTART_COUNT": "-1"}, "MWJ_RESTART_COUNT: -1 is out of range (>= 0)"),
        (
            {"MWJ_PROGRESS_PORT": "70000"},
            "MWJ_PROGRESS_PORT: 70000 is out of range (0..65535)",
        ),
        (
            {"MWJ_PEER_TIMEOUT_SECONDS": "soon"},
            "MWJ_PEER_TIMEOUT_SECONDS: 'soon' is not a number",
        ),
        (
            {"MWJ_COLLECTIVE_TIMEOUT_SECONDS": "0"},
            "MWJ_COLLECTIVE_TIMEOUT_SECONDS: '0' must be a positive",
        ),
        (
            {"MWJ_COLLECTIVE_TIMEOUT_SECONDS": "inf"},
            "MWJ_COLLECTIVE_TIMEOUT_SECONDS: 'inf' must be",
        ),
    ],
)
def test_malformed_environment_is_rejected_naming_the_variable(
    overrides: dict[str, str | None], expected: str
) -> None:
    assert any(p.startswith(expected) for p in problems(env(**overrides))), expected


def test_every_problem_is_reported_at_once() -> None:
    found = problems(env(TF_CONFIG=tf_config(PEERS, 5, "ps"), MWJ_PROGRESS_PORT="x"))
    assert found == [
        "TF_CONFIG.task.type: must be 'worker', got 'ps'",
        "TF_CONFIG.task.index: 5 is out of range for 2 workers (0..1)",
        "MWJ_WORKER_INDEX: 1 does not match TF_CONFIG.task.index 5",
        "MWJ_PROGRESS_PORT: 'x' is not an integer",
    ]
    assert str(ConfigError(found)).startswith(
        "bad worker configuration: TF_CONFIG.task.type"
    )


def test_only_worker_tasks_are_supported() -> None:
    raw = json.dumps(
        {
            "cluster": {"worker": PEERS, "ps": ["p:1"]},
            "task": {"type": "worker", "index": 0},
        }
    )
    assert problems(env(TF_CONFIG=raw, MWJ_WORKER_INDEX="0")) == [
        "TF_CONFIG.cluster: only 'worker' tasks are supported, got ps"
    ]


def test_the_in_place_agents_word_raises_a_stale_generation(tmp_path: Path) -> None:
    """In place, the kubelet may create the trainer's container from a copy of the pod whose
    label has not moved yet; the agent's file (the operator's word) has."""
    generation = tmp_path / "pod-generation"
    generation.write_text("3")
    stale = load_config(env(MWJ_RESTART_COUNT="2", MWJ_POD_GENERATION_FILE=str(generation)))
    assert stale.restart_count == 3
    generation.write_text("1")  # older than the label: the label wins
    assert load_config(env(MWJ_RESTART_COUNT="2",
                           MWJ_POD_GENERATION_FILE=str(generation))).restart_count == 2
    missing = str(tmp_path / "absent")
    assert load_config(env(MWJ_RESTART_COUNT="2",
                           MWJ_POD_GENERATION_FILE=missing)).restart_count == 2
