from __future__ import annotations

import pytest
from multiworker.api import names


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
    problems = names.name_problems(job, workers)
    assert (not problems) == ok
    if not ok:
        assert longest in problems[0] and "metadata.name" in problems[0]


@pytest.mark.parametrize("job", ["Demo", "1job", "my.job", "job-", "j_b"])
def test_job_name_must_be_a_dns_1035_label(job: str) -> None:
    [problem] = names.name_problems(job, 1)
    assert problem.startswith("metadata.name:") and "DNS-1035" in problem
