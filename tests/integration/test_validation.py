"""Invalid jobs are refused by `kubectl apply` itself (structural schema + CEL), naming the
field — no webhook, no operator needed. spec.template is the pinned Kubernetes' full
PodTemplateSpec schema, so a typo deep inside it is refused too (kubectl's default strict field
validation). Examples in examples/ pass the same checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import REPO
from tests.integration.jobs import Jobs, job

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
Obj = dict[str, Any]


def container(manifest: Obj) -> Obj:
    result: Obj = manifest["spec"]["template"]["spec"]["containers"][0]
    return result


def set_spec(**spec: Any) -> Callable[[Obj], None]:
    return lambda m: m["spec"].update(spec)


def set_pod_spec(**spec: Any) -> Callable[[Obj], None]:
    return lambda m: m["spec"]["template"]["spec"].update(spec)


INVALID: list[tuple[str, Callable[[Obj], None], str]] = [
    ("no-workers", set_spec(workers=0), "spec.workers"),
    ("too-many-workers", set_spec(workers=1025), "spec.workers"),
    ("restart-always", set_pod_spec(restartPolicy="Always"),
     "spec.template.spec.restartPolicy must be Never or unset"),
    ("own-hostname", set_pod_spec(hostname="mine"), "spec.template.spec.hostname"),
    ("host-network", set_pod_spec(hostNetwork=True),
     "spec.template.spec.hostNetwork: Invalid value"),
    ("container-restarts", lambda m: container(m).update(restartPolicy="Always"),
     "spec.template.spec.containers[0].restartPolicy: Invalid value"),
    ("container-restart-rules", lambda m: container(m).update(restartPolicyRules=[
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]),
     "restartPolicy and restartPolicyRules must be unset"),
    ("no-containers", set_pod_spec(containers=[]), "spec.template.spec.containers"),
    ("no-image", lambda m: container(m).pop("image"), "spec.template.spec.containers[0].image"),
    ("same-ports", set_spec(port=8471), "spec.health.progressPort must differ from spec.port"),
    ("agent-port", set_spec(port=8472, restartPolicy={"mode": "InPlace"}),
     "spec.restartPolicy.agentPort must differ from spec.port"),
    ("bad-backoff", set_spec(restartPolicy={"backoffSeconds": 60, "maxBackoffSeconds": 5}),
     "spec.restartPolicy.maxBackoffSeconds must be at least backoffSeconds"),
    ("exit-zero-rule", set_spec(restartPolicy={"onExitCodes": [
        {"action": "FailJob", "values": [0]}]}), "spec.restartPolicy.onExitCodes[0].values[0]"),
    ("bad-action", set_spec(restartPolicy={"onExitCodes": [
        {"action": "Retry", "values": [1]}]}), "spec.restartPolicy.onExitCodes[0].action"),
    ("bad-success", set_spec(successPolicy="Sometimes"), "spec.successPolicy"),
    ("relative-mount", set_spec(checkpoint={"claimName": "c", "mountPath": "ckpt"}),
     "spec.checkpoint.mountPath"),
    ("straggler-zero", set_spec(health={"stragglerThreshold": 0}),
     "spec.health.stragglerThreshold"),
    ("reserved-label", lambda m: m["spec"]["template"].update(
        metadata={"labels": {"multiworker.dev/job-name": "x"}}),
     "spec.template.metadata.labels: keys under multiworker.dev/ are reserved"),
    ("elastic-above-workers", set_spec(elastic={"minWorkers": 3}),
     "spec.elastic.minWorkers must not exceed spec.workers"),
    ("elastic-zero", set_spec(elastic={"minWorkers": 0}), "spec.elastic.minWorkers"),
    ("elastic-batch", set_spec(elastic={"minWorkers": 1, "batch": "Halve"}),
     "spec.elastic.batch"),
    # Typed all the way down: Kubernetes' own types of pod fields.
    ("port-not-a-number", lambda m: container(m).update(ports=[{"containerPort": "http"}]),
     "spec.template.spec.containers[0].ports[0].containerPort"),
    ("env-not-a-list", lambda m: container(m).update(env={"A": "1"}),
     "spec.template.spec.containers[0].env"),
]


def test_unknown_field_deep_in_the_template_is_refused(jobs: Jobs) -> None:
    manifest = job("typo", "exit 0", workers=2)
    container(manifest)["resources"] = {"limit": {"cpu": "1"}}  # limits, misspelt
    proc = jobs.apply(manifest, check=False)
    assert proc.returncode != 0, "a template with resources.limit was accepted"
    assert 'unknown field "spec.template.spec.containers[0].resources.limit"' in proc.stderr
    assert jobs.get("typo") is None


def test_quantities_are_integers_or_strings(jobs: Jobs) -> None:
    manifest = job("quantities", "exit 0", workers=2)
    container(manifest)["resources"] = {"limits": {"cpu": "500m", "memory": "1Gi",
                                                   "nvidia.com/gpu": 1}}
    jobs.apply(manifest)
    stored = jobs.get("quantities")
    assert stored is not None
    assert container(stored)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_kubectl_explain_shows_kubernetes_docs_inside_the_template(jobs: Jobs) -> None:
    proc = jobs.kubectl("explain", "mwj.spec.template.spec.containers.resources")
    assert "Compute Resources required by this container" in proc.stdout
    assert "limits" in proc.stdout and "requests" in proc.stdout


@pytest.mark.parametrize(("name", "mutate", "field"), INVALID, ids=[i[0] for i in INVALID])
def test_invalid_job_is_refused_naming_the_field(
    jobs: Jobs, name: str, mutate: Callable[[Obj], None], field: str
) -> None:
    manifest = job(name, "exit 0", workers=2)
    mutate(manifest)
    proc = jobs.apply(manifest, check=False)
    assert proc.returncode != 0, f"{name} was accepted"
    assert field in proc.stderr, proc.stderr


@pytest.mark.parametrize(("name", "workers", "ok"), [
    ("a" * 54, 10, True),  # <54>-worker-9: exactly 63 characters
    ("a" * 54, 11, False),  # <54>-worker-10: 64
    ("a" * 51, 600, True),
    ("a" * 52, 1024, False),
])
def test_longest_worker_hostname_decides(jobs: Jobs, name: str, workers: int, ok: bool) -> None:
    proc = jobs.apply(job(name, "exit 0", workers=workers, suspend=True), check=False)
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert "metadata.name is too long for spec.workers" in proc.stderr


@pytest.mark.parametrize(("name", "workers", "ok"), [
    ("a" * 20, 1007, True),  # TF_CONFIG at most 131,010 bytes in any namespace
    ("a" * 20, 1008, False),  # 131,140: more than one environment string may hold
    ("a" * 51, 1024, False),  # a valid hostname (<51>-worker-1023), ~196 KB of TF_CONFIG
])
def test_tf_config_must_fit_one_environment_string(
    jobs: Jobs, name: str, workers: int, ok: bool,
) -> None:
    proc = jobs.apply(job(name, "exit 0", workers=workers, suspend=True), check=False)
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert "TF_CONFIG lists every worker's address and must fit one environment variable" \
            in proc.stderr


def test_name_must_be_a_dns_1035_label(jobs: Jobs) -> None:
    proc = jobs.apply(job("1train", "exit 0"), check=False)
    assert proc.returncode != 0 and "metadata.name must be a DNS-1035 label" in proc.stderr


def test_defaults_are_visible_in_the_stored_job(jobs: Jobs) -> None:
    jobs.apply(job("defaults", "exit 0", workers=2))
    stored = jobs.get("defaults")
    assert stored is not None
    spec = stored["spec"]
    assert spec["port"] == 2222 and spec["successPolicy"] == "ChiefSucceeded"
    assert spec["restartPolicy"] == {"maxRestarts": 3, "maxDisruptions": 20, "backoffSeconds": 1,
                                     "maxBackoffSeconds": 300, "defaultAction": "RestartGroup",
                                     "mode": "Recreate", "agentPort": 8472,
                                     "survivorSaveSeconds": 300, "warmStandby": True,
                                     "warmModules": ["tensorflow"],
                                     "failFastOnRepeatedStartupError": True}
    assert spec["health"]["progressPort"] == 8471
    assert spec["health"]["startupTimeoutSeconds"] == 300


def test_an_elastic_minimum_up_to_workers_is_accepted_with_its_defaults(jobs: Jobs) -> None:
    manifest = job("elastic", "exit 0", workers=2)
    manifest["spec"]["elastic"] = {"minWorkers": 2}
    jobs.apply(manifest)
    stored = jobs.get("elastic")
    assert stored is not None
    assert stored["spec"]["elastic"] == {"minWorkers": 2, "shrinkAfterSeconds": 60,
                                         "growAfterSeconds": 120, "batch": "KeepGlobal"}


def test_workers_change_only_while_suspended(jobs: Jobs) -> None:
    jobs.apply(job("resize", "exit 0", workers=2, suspend=False))
    proc = jobs.kubectl("patch", "mwj", "resize", "--type=merge", "-p",
                        '{"spec": {"workers": 3}}', check=False)
    assert proc.returncode != 0
    assert "spec.workers can only change while the job is suspended" in proc.stderr
    jobs.patch_spec("resize", suspend=True, workers=3)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_accepted_by_the_api_server(jobs: Jobs, example: Path) -> None:
    jobs.kubectl("apply", "--dry-run=server", "-f", str(example))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"cpu-job.yaml", "gpu-job.yaml", "checkpoint-pvc.yaml"}
