from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from multiworker.api.job import InvalidJobSpec, Job
from multiworker.api.schema import format_time
from multiworker.api.spec import CleanPodPolicy, ExitCodeAction, SuccessPolicy
from multiworker.api.status import JobStatus

from tests.unit.builders import job_body, make_spec, spec_dict


def test_defaults_match_the_issue() -> None:
    spec = make_spec()
    assert spec.port == 2222
    assert spec.restart_policy.max_restarts == 3
    assert spec.success_policy is SuccessPolicy.CHIEF_SUCCEEDED
    assert spec.clean_pod_policy is CleanPodPolicy.RUNNING
    assert spec.suspend is False
    assert spec.health.progress_port == 8471
    assert spec.health.startup_timeout_seconds == 300
    assert spec.health.progress_timeout_seconds is None
    assert spec.checkpoint is None
    checkpointed = make_spec(checkpoint={"claimName": "ckpt"})
    assert checkpointed.checkpoint is not None
    assert checkpointed.checkpoint.mount_path == "/checkpoints"
    assert checkpointed.checkpoint.resume_from is None


@pytest.mark.parametrize(
    "path", ["ml/demo-4c1e0b2a-0d4e-4b6a-9f0e-1d2c3b4a5f60", "runs/v1.2_final", "x", "."]
)
def test_resume_from_accepts_paths_inside_the_claim(path: str) -> None:
    spec = make_spec(checkpoint={"claimName": "c", "resumeFrom": path})
    assert spec.checkpoint is not None and spec.checkpoint.resume_from == path


def test_exit_code_rules_first_match_wins_then_default() -> None:
    policy = make_spec(restartPolicy={
        "onExitCodes": [
            {"action": "FailJob", "values": [2]},
            {"action": "RestartGroup", "values": [2, 137]},
        ],
        "defaultAction": "FailJob",
    }).restart_policy
    assert policy.action_for(2) is ExitCodeAction.FAIL_JOB
    assert policy.action_for(137) is ExitCodeAction.RESTART_GROUP
    assert policy.action_for(1) is ExitCodeAction.FAIL_JOB


def problems(**spec_overrides: Any) -> list[str]:
    with pytest.raises(InvalidJobSpec) as raised:
        Job.from_body(job_body(**spec_overrides))
    return raised.value.problems


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"workers": 0}, "spec.workers:"),
        ({"workers": 1025}, "spec.workers:"),
        ({"port": 70000}, "spec.port:"),
        ({"restartPolicy": {"maxRestarts": -1}}, "spec.restartPolicy.maxRestarts:"),
        ({"restartPolicy": {"backoffSeconds": 60, "maxBackoffSeconds": 10}},
         "spec.restartPolicy: maxBackoffSeconds"),
        ({"restartPolicy": {"onExitCodes": [{"action": "FailJob", "values": [0]}]}},
         "spec.restartPolicy.onExitCodes[0].values[0]:"),
        ({"restartPolicy": {"onExitCodes": [{"action": "Retry", "values": [1]}]}},
         "spec.restartPolicy.onExitCodes[0].action:"),
        ({"successPolicy": "Sometimes"}, "spec.successPolicy:"),
        ({"checkpoint": {"claimName": "c", "mountPath": "relative"}}, "spec.checkpoint.mountPath:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": "/abs"}}, "spec.checkpoint.resumeFrom:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": "a/../../b"}},
         "spec.checkpoint.resumeFrom:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": ".."}}, "spec.checkpoint.resumeFrom:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": "./a"}}, "spec.checkpoint.resumeFrom:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": "a//b"}}, "spec.checkpoint.resumeFrom:"),
        ({"checkpoint": {"claimName": "c", "resumeFrom": "a/"}}, "spec.checkpoint.resumeFrom:"),
        ({"health": {"stragglerThreshold": 0}}, "spec.health.stragglerThreshold:"),
        ({"health": {"progressPort": 2222}}, "spec: health.progressPort must differ from port"),
        ({"restartPolicy": {"mode": "InPlace", "agentPort": 2222}},
         "spec: restartPolicy.agentPort must differ"),
        ({"restartPolicy": {"mode": "InPlace", "agentPort": 8471}},
         "spec: restartPolicy.agentPort must differ"),
        ({"workers": 2, "elastic": {"minWorkers": 3}},
         "spec: elastic.minWorkers must not exceed workers"),
        ({"elastic": {"minWorkers": 0}}, "spec.elastic.minWorkers:"),
        ({"elastic": {"minWorkers": 1, "batch": "Halve"}}, "spec.elastic.batch:"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers:"),
        ({"template": {"spec": {"containers": [{"name": "tf"}]}}},
         "spec.template.spec.containers[0].image:"),
        ({"template": {"spec": {"restartPolicy": "OnFailure",
                                "containers": [{"name": "tf", "image": "i"}]}}},
         "spec.template.spec: restartPolicy 'OnFailure' must be Never"),
        ({"template": {"spec": {"hostname": "x", "containers": [{"name": "tf", "image": "i"}]}}},
         "spec.template.spec: hostname and subdomain must be unset"),
        ({"template": {"metadata": {"labels": {"multiworker.dev/job-name": "x"}},
                       "spec": {"containers": [{"name": "tf", "image": "i"}]}}},
         "spec.template: metadata.labels ['multiworker.dev/job-name'] are reserved"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], field: str) -> None:
    found = problems(**overrides)
    assert any(p.startswith(field) for p in found), found


def test_every_problem_is_reported_not_just_the_first() -> None:
    found = problems(workers=0, port=0, successPolicy="Sometimes")
    assert {p.split(":")[0] for p in found} == {"spec.workers", "spec.port", "spec.successPolicy"}


def test_name_problems_come_with_spec_problems() -> None:
    with pytest.raises(InvalidJobSpec) as raised:
        Job.from_body(job_body(name="x" * 60))
    assert raised.value.problems[0].startswith("metadata.name: worker hostname")


def test_template_round_trips_unknown_fields() -> None:
    template = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}},
        "spec": {
            "nodeSelector": {"gpu": "yes"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "tensorflow", "image": "img",
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "command": ["python3", "train.py"],
            }],
        },
    }
    spec = make_spec(template=template)
    assert spec.template.as_dict() == template


def test_trainer_is_the_tensorflow_container_or_the_first() -> None:
    two = [{"name": "sidecar", "image": "s"}, {"name": "tensorflow", "image": "t"}]
    assert make_spec(template={"spec": {"containers": two}}).template.trainer_container() == \
        "tensorflow"
    other = [{"name": "trainer", "image": "t"}, {"name": "sidecar", "image": "s"}]
    assert make_spec(template={"spec": {"containers": other}}).template.trainer_container() == \
        "trainer"


def test_status_round_trips_with_camel_case_and_rfc3339() -> None:
    when = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
    status = JobStatus(group_generation=2, restart_after=when, ready="3/4")
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["groupGeneration"] == 2
    assert dumped["restartAfter"] == "2026-01-01T12:00:00.250Z"
    assert JobStatus.model_validate(dumped) == status


def test_format_time() -> None:
    assert format_time(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00Z"


def test_spec_dict_is_valid() -> None:
    assert make_spec(**spec_dict()).workers == 3


def test_the_agent_port_matters_only_in_place() -> None:
    """Recreate runs no agent: a trainer may keep the port (no job refused for a field it
    does not use)."""
    job = Job.from_body(job_body(port=8472))
    assert job.spec.restart_policy.agent_port == job.spec.port == 8472
