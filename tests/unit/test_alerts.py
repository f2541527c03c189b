"""The chart's alerts under `promtool test rules`: each fires on the series that mean trouble,
at the time its `for` says, with the labels that name the job, and stays quiet on the
look-alikes (a finished job, a job recreated under its name, a Lease handed over, a Kueue
queue). promtool is built from Prometheus' Go module if missing (never skipped).

Series are written in promtool's notation (`0+1x3` is 0 1 2 3, one sample per `interval`;
`stale` ends a series). The expected annotations are the rule's own templates with the
expected labels and value put in, so a template naming a label the alert lacks fails here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring import (
    RUNBOOK_URL,
    RUNBOOKS,
    alerts,
    chart_rule_groups,
    prometheus_binaries,
    write_rule_file,
)

Obj = dict[str, Any]
JOB = {"job_namespace": "ml", "instance": "op-0:8080"}


def job(name: str, **labels: str) -> str:
    """A per-job series selector: `job` fills job_namespace, job_name and instance."""
    pairs = {**JOB, "job_name": name, **labels}
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


# (what it shows, input series, [(eval time, alert, [(labels, $value as the template shows
# it)])]); an empty list of alerts asserts that none fires then.
Case = tuple[str, dict[str, str], list[tuple[str, str, list[tuple[Obj, str]]]]]
CASES: list[Case] = [
    (("three restarts in 15 minutes, then a minute of `for`; not a failed job's, not a job "
     "recreated under the same name (its restarts start again from 0)"), {
        f"multiworker_job_restarts{job('loop')}": "0+1x3 3x20",
        f"multiworker_job_phase{job('loop', phase='Restarting')}": "1x25",
        f"multiworker_job_restarts{job('spent')}": "0+1x3 3x20",
        f"multiworker_job_phase{job('spent', phase='Failed')}": "1x25",
        f"multiworker_job_restarts{job('again')}": "5x3 0 0 1 2",
        f"multiworker_job_phase{job('again', phase='Running')}": "1x25",
    }, [
        ("2m", "MultiWorkerJobRestartLoop", []),
        ("3m", "MultiWorkerJobRestartLoop", []),  # pending: 3 restarts, `for` not yet over
        ("4m", "MultiWorkerJobRestartLoop",
         [({"job_namespace": "ml", "job_name": "loop", "severity": "warning"}, "3")]),
        ("7m", "MultiWorkerJobRestartLoop",
         [({"job_namespace": "ml", "job_name": "loop", "severity": "warning"}, "3")]),
    ]),
    (("no running group for 15 minutes, across phase changes (Pending, then Starting); a job "
     "queued in Kueue waits by design"), {
        f"multiworker_job_phase{job('stuck', phase='Pending')}": "1x9 stale",
        f"multiworker_job_phase{job('stuck', phase='Starting')}": "_x10 1x20",
        f"multiworker_job_phase{job('queued', phase='Queued')}": "1x30",
        f"multiworker_job_phase{job('fine', phase='Pending')}": "1x5 stale",
        f"multiworker_job_phase{job('fine', phase='Running')}": "_x6 1x25",
    }, [
        ("14m", "MultiWorkerJobNotStarting", []),
        ("16m", "MultiWorkerJobNotStarting",
         [({"job_namespace": "ml", "job_name": "stuck", "severity": "warning"}, "1")]),
    ]),
    (("a running job whose step has not moved for 30 minutes, then 15 of `for`; one that "
     "trains and one that reports no progress at all stay quiet"), {
        f"multiworker_job_phase{job('stalled', phase='Running')}": "1x80",
        f"multiworker_job_progress_step{job('stalled')}": "100+10x10 200x70",
        f"multiworker_job_phase{job('training', phase='Running')}": "1x80",
        f"multiworker_job_progress_step{job('training')}": "0+10x80",
        f"multiworker_job_phase{job('silent', phase='Running')}": "1x80",
    }, [
        ("50m", "MultiWorkerJobProgressStalled", []),
        ("56m", "MultiWorkerJobProgressStalled",
         [({"job_namespace": "ml", "job_name": "stalled", "severity": "warning"}, "1")]),
    ]),
    ("no operator scraped for 5 minutes", {
        'multiworker_jobs{phase="Running",instance="op-0:8080"}': "1x3 stale",
    }, [
        ("3m", "MultiWorkerOperatorDown", []),
        ("8m", "MultiWorkerOperatorDown", []),
        ("10m", "MultiWorkerOperatorDown", [({"severity": "critical"}, "1")]),
    ]),
    (("a namespace no instance leads for 2 minutes; a Lease handed over between instances "
     "is not one"), {
        'multiworker_namespace_leading{job_namespace="ml",instance="op-0:8080"}': "1x2 0x10",
        'multiworker_namespace_leading{job_namespace="ml",instance="op-1:8080"}': "0x12",
        'multiworker_namespace_leading{job_namespace="cv",instance="op-0:8080"}': "1 1 0 0 0x8",
        'multiworker_namespace_leading{job_namespace="cv",instance="op-1:8080"}': "0 0 0 1 1x8",
    }, [
        ("4m", "MultiWorkerNamespaceWithoutLeader", []),
        ("6m", "MultiWorkerNamespaceWithoutLeader",
         [({"job_namespace": "ml", "severity": "critical"}, "0")]),
    ]),
    ("most API requests failing for 5 minutes (connection errors once the server went away)",
     {
        'multiworker_api_requests_total{verb="update",resource="coordination.k8s.io/leases",'
        'code="200",instance="op-0:8080"}': "0+12x5 60x20",
        'multiworker_api_requests_total{verb="update",resource="coordination.k8s.io/leases",'
        'code="error",instance="op-0:8080"}': "0x5 20+20x20",
        'multiworker_api_requests_total{verb="list",resource="pods",code="403",'
        'instance="op-1:8080"}': "0+20x25",  # refused, not unreachable: no alert
        'multiworker_api_requests_total{verb="list",resource="pods",code="200",'
        'instance="op-1:8080"}': "0+1x25",
    }, [
        ("11m", "MultiWorkerOperatorAPIServerErrors", []),
        ("13m", "MultiWorkerOperatorAPIServerErrors",
         [({"instance": "op-0:8080", "severity": "critical"}, "100%")]),
    ]),
    ("reconcile passes failing for 15 minutes; one failure does not", {
        'multiworker_reconcile_errors_total{instance="op-0:8080"}': "0+1x40",
        'multiworker_reconcile_errors_total{instance="op-1:8080"}': "0 1x40",
    }, [
        ("15m", "MultiWorkerReconcileErrors", []),
        ("17m", "MultiWorkerReconcileErrors",
         [({"instance": "op-0:8080", "severity": "warning"}, "10")]),
    ]),
]

LABEL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")
VALUE = re.compile(r"\{\{\s*\$value[^}]*\}\}")


def expected_annotations(rule: Obj, labels: Obj, value: str) -> Obj:
    def fill(text: str) -> str:
        return VALUE.sub(value, LABEL.sub(lambda m: labels[m.group(1)], text))

    return {key: fill(text) for key, text in rule["annotations"].items()}


def promtool_tests(rules: dict[str, Obj]) -> Obj:
    tests = []
    for name, series, checks in CASES:
        tests.append({
            "name": name,
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{
                "eval_time": at,
                "alertname": alert,
                "exp_alerts": [{"exp_labels": labels,
                                "exp_annotations": expected_annotations(rules[alert], labels,
                                                                        value)}
                               for labels, value in expected],
            } for at, alert, expected in checks],
        })
    return {"rule_files": ["multiworker-rules.yaml"], "evaluation_interval": "1m",
            "tests": tests}


@pytest.fixture(scope="module")
def promtool() -> Path:
    return prometheus_binaries()[0]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return chart_rule_groups(tmp_path_factory.mktemp("chart"))


def test_the_charts_rules_pass_promtool_check(promtool: Path, groups: list[Obj],
                                              tmp_path: Path) -> None:
    path = write_rule_file(tmp_path, groups)
    proc = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_fires_when_it_should_and_only_then(promtool: Path, groups: list[Obj],
                                                        tmp_path: Path) -> None:
    write_rule_file(tmp_path, groups)
    path = tmp_path / "multiworker-rules.test.yaml"
    path.write_text(yaml.safe_dump(promtool_tests(alerts(groups)), sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", path.name], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested(groups: list[Obj]) -> None:
    tested = {alert for _, _, checks in CASES for _, alert, expected in checks if expected}
    assert tested == set(alerts(groups))


def test_every_alert_names_its_subject_and_links_its_runbook_section(groups: list[Obj]) -> None:
    headings = {line[3:].strip().lower() for line in RUNBOOKS.read_text().splitlines()
                if line.startswith("## ")}
    for name, rule in alerts(groups).items():
        notes = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(notes), name
        assert notes["runbook_url"] == f"{RUNBOOK_URL}#{name.lower()}", name
        assert name.lower() in headings, f"docs/runbooks.md has no section '## {name}'"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        per_job = "job_name" in rule["expr"] or "multiworker_job_" in rule["expr"]
        if per_job:
            for key in ("summary", "description"):
                assert "$labels.job_namespace" in notes[key] and "$labels.job_name" in notes[key]

