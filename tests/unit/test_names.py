from __future__ import annotations

import json

import pytest
from multiworker.api import names
from multiworker.reconcile.render import tf_config


def test_worker_names_and_dns() -> None:
    assert names.worker_name("demo", 2) == "demo-worker-2"
    assert names.service_name("demo") == "demo"
    assert names.worker_hostname("demo", "ml", 2) == "demo-worker-2.demo.ml.svc"
    assert names.worker_address("demo", "ml", 0, 2222) == "demo-worker-0.demo.ml.svc:2222"


def test_labels_and_selector() -> None:
    labels = names.worker_labels("demo", 3, 7)
    assert labels == {
        "multiworker.dev/job-name": "demo",
        "multiworker.dev/worker-index": "3",
        "multiworker.dev/group-generation": "7",
    }
    assert names.label_selector(names.job_selector("demo")) == "multiworker.dev/job-name=demo"


@pytest.mark.parametrize(
    ("length", "workers", "ok"),
    [
        (54, 1, True),  # <54>-worker-0 is exactly 63 characters
        (55, 1, False),
        (54, 10, True),  # the longest is worker-9: still one digit
        (54, 11, False),  # worker-10 makes it 64
        (53, 100, True),
        (51, 1024, True),  # <51>-worker-1023 is 63
        (52, 1024, False),
    ],
)
def test_longest_worker_name_decides(length: int, workers: int, ok: bool) -> None:
    job = "j" * length
    longest = names.worker_name(job, workers - 1)
    assert (len(longest) <= 63) == ok
    problems = [p for p in names.name_problems(job, workers) if p.startswith("metadata.name")]
    assert (not problems) == ok
    if not ok:
        assert longest in problems[0]


@pytest.mark.parametrize("job", ["Demo", "1job", "my.job", "job-", "j_b"])
def test_job_name_must_be_a_dns_1035_label(job: str) -> None:
    [problem] = names.name_problems(job, 1)
    assert problem.startswith("metadata.name:") and "DNS-1035" in problem


@pytest.mark.parametrize(("length", "workers", "ok"), [
    (20, 1007, True),   # the bound: 131,010 bytes
    (20, 1008, False),  # 131,140
    (51, 680, True),
    (51, 1024, False),  # a valid hostname, but TF_CONFIG would be ~196 KB: no worker could exec
    (5, 1024, True),
])
def test_tf_config_must_fit_one_environment_string(length: int, workers: int, ok: bool) -> None:
    job = "j" * length
    problems = [p for p in names.name_problems(job, workers) if p.startswith("spec.workers")]
    assert (not problems) == ok
    if not ok:
        assert "TF_CONFIG" in problems[0] and str(names.MAX_ENV_STRING) in problems[0]


@pytest.mark.parametrize(("length", "workers"), [(20, 1007), (51, 680), (1, 1), (9, 10)])
def test_the_bound_holds_for_the_longest_namespace_and_port(length: int, workers: int) -> None:
    """The rendered `TF_CONFIG=<json>` plus its NUL never exceeds what the CRD's rule computes
    (the rule cannot see the namespace, so it assumes 63 characters)."""
    job, namespace = "j" * length, "n" * 63
    value = json.dumps(tf_config(job, namespace, workers, 65535, workers - 1),
                       separators=(",", ":"))
    actual = len(f"TF_CONFIG={value}".encode()) + 1
    assert actual <= names.tf_config_bound(job, workers)
