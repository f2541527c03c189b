from __future__ import annotations

from typing import Any

import pytest
from multiworker.api import names
from multiworker.api.job import InvalidJobSpec, Job
from multiworker.api.spec import DEFAULT_GANG_SCHEDULER
from multiworker.reconcile import gang
from multiworker.reconcile.render import owner_reference, render_worker_pod

from tests.unit.builders import JOB, JOB_UID, NAMESPACE, job_body, make_job, make_spec


def test_gang_defaults_leave_the_choice_to_the_operator() -> None:
    spec = make_spec()
    assert spec.gang.enabled is None
    assert spec.gang.scheduler_name == DEFAULT_GANG_SCHEDULER == "scheduler-plugins-scheduler"
    assert spec.gang.schedule_timeout_seconds == 60


@pytest.mark.parametrize(("enabled", "default", "expected"), [
    (None, False, False),
    (None, True, True),
    (True, False, True),
    (False, True, False),
])
def test_the_job_decides_else_the_operator_default(
    enabled: bool | None, default: bool, expected: bool
) -> None:
    gang_spec = {} if enabled is None else {"enabled": enabled}
    assert gang.gang_enabled(make_spec(gang=gang_spec), default) is expected


@pytest.mark.parametrize(("gang_spec", "field"), [
    ({"scheduleTimeoutSeconds": 0}, "spec.gang.scheduleTimeoutSeconds"),
    ({"scheduleTimeoutSeconds": 86401}, "spec.gang.scheduleTimeoutSeconds"),
    ({"schedulerName": ""}, "spec.gang.schedulerName"),
    ({"schedulerName": "Not_A_Name"}, "spec.gang.schedulerName"),
])
def test_bad_gang_fields_are_named(gang_spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJobSpec) as raised:
        Job.from_body(job_body(gang=gang_spec))
    assert any(p.startswith(f"{field}:") for p in raised.value.problems), raised.value.problems


@pytest.mark.parametrize(("job", "generation", "expected"), [
    ("demo", 0, "demo-g0"),
    ("demo", 17, "demo-g17"),
    ("a" * 54, 123456, "a" * 54 + "-g123456"),  # exactly 63
])
def test_pod_group_name_per_generation(job: str, generation: int, expected: str) -> None:
    assert gang.pod_group_name(job, generation) == expected


def test_long_pod_group_names_stay_valid_label_values_and_distinct() -> None:
    long_a, long_b = "a" * 54, "a" * 53 + "b"
    first = gang.pod_group_name(long_a, 10**8)
    second = gang.pod_group_name(long_b, 10**8)
    for name in (first, second):
        assert len(name) <= 63
        assert name.endswith("-g100000000")
        assert name[0].isalnum() and name[-1].isalnum()
    assert first != second
    assert gang.pod_group_name(long_a, 10**8) == first  # deterministic


def test_render_pod_group() -> None:
    job = make_job(workers=4, gang={"enabled": True, "scheduleTimeoutSeconds": 120})
    owner = owner_reference(job)
    assert gang.render_pod_group(job, 2, owner) == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": f"{JOB}-g2",
            "namespace": NAMESPACE,
            "labels": {names.LABEL_JOB_NAME: JOB, names.LABEL_GROUP_GENERATION: "2"},
            "ownerReferences": [owner],
        },
        "spec": {"minMember": 4, "scheduleTimeoutSeconds": 120},
    }


def test_gang_fields_on_a_worker_pod() -> None:
    job = make_job(gang={"enabled": True, "schedulerName": "my-gang"},
                   template={"spec": {"schedulerName": "default-scheduler", "containers": [
                       {"name": "tensorflow", "image": "img"}]},
                       "metadata": {"labels": {"team": "a"}}})
    pod = render_worker_pod(job, 1, 3, owner_reference(job))
    fields = gang.gang_pod_fields(job, 3)
    assert fields == gang.GangPodFields(
        labels={"scheduling.x-k8s.io/pod-group": f"{JOB}-g3"}, scheduler_name="my-gang")
    ganged = gang.with_gang_fields(pod, fields)
    assert ganged["spec"]["schedulerName"] == "my-gang"
    assert ganged["metadata"]["labels"] == {
        "team": "a", **names.worker_labels(JOB, 1, 3), gang.POD_GROUP_LABEL: f"{JOB}-g3"}
    assert pod["spec"]["schedulerName"] == "default-scheduler"  # the input is not changed
    assert gang.POD_GROUP_LABEL not in pod["metadata"]["labels"]


def pod_group(name: str, generation: str | None, uid: str = JOB_UID,
              controller: bool = True) -> dict[str, Any]:
    labels = {names.LABEL_JOB_NAME: JOB}
    if generation is not None:
        labels[names.LABEL_GROUP_GENERATION] = generation
    return {"metadata": {"name": name, "labels": labels,
                         "ownerReferences": [{"uid": uid, "controller": controller}]}}


def test_stale_pod_groups_are_the_job_s_own_of_other_generations() -> None:
    groups = [
        pod_group("demo-g0", "0"),
        pod_group("demo-g2", "2"),
        pod_group("demo-g1", "1"),  # current
        pod_group("other-g0", "0", uid="someone-else"),
        pod_group("adopted", "0", controller=False),
        pod_group("unlabelled", None),
    ]
    assert gang.stale_pod_groups(groups, JOB_UID, 1) == ["demo-g0", "demo-g2", "unlabelled"]


@pytest.mark.parametrize(("discovery", "served"), [
    (None, False),
    ({}, False),
    ({"resources": [{"name": "elasticquotas"}]}, False),
    ({"resources": [{"name": "podgroups"}, {"name": "podgroups/status"}]}, True),
])
def test_pod_group_api_served(discovery: dict[str, Any] | None, served: bool) -> None:
    assert gang.pod_group_api_served(discovery) is served


def test_unavailable_message_says_what_to_install_and_what_happens() -> None:
    message = gang.unavailable_message("my-gang")
    assert "podgroups.scheduling.x-k8s.io" in message
    assert "'my-gang'" in message
    assert "spec.gang.enabled: false" in message
    assert "no workers are created" in message


def test_operator_flag_for_the_default() -> None:
    from multiworker.cli import parse_args

    assert parse_args(["-A"]).default_gang_scheduling is False
    assert parse_args(["-A", "--default-gang-scheduling"]).default_gang_scheduling is True
