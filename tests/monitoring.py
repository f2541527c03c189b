"""What the alert and dashboard tests share: Prometheus' binaries (built from the Go module by
hack/cluster/build-prometheus.sh), the chart's rules as Helm renders them, and the queries of
the chart's dashboard.

The rules are tested exactly as the chart ships them: `helm template` with
metrics.prometheusRule.enabled, the PrometheusRule's spec written out as a rule file.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import BIN, REPO

CHART = REPO / "charts" / "multiworker-operator"
DASHBOARD = CHART / "dashboards" / "multiworker.json"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_URL = "docs/runbooks.md"  # metrics.prometheusRule.runbookUrl's default
Obj = dict[str, Any]


def prometheus_binaries() -> tuple[Path, Path]:
    """promtool and prometheus, built if missing (a build under way elsewhere — CI's
    background builds — is waited for: the script holds a lock). A failed build fails the
    caller: these tests never skip."""
    script = REPO / "hack" / "cluster" / "build-prometheus.sh"
    proc = subprocess.run(["nice", "-n", "10", str(script)], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=1800)
    assert proc.returncode == 0, (f"hack/cluster/build-prometheus.sh exited {proc.returncode}:"
                                  f"\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    promtool, prometheus = BIN / "promtool", BIN / "prometheus"
    assert promtool.exists() and prometheus.exists(), f"no promtool or prometheus in {BIN}"
    return promtool, prometheus


def render_chart(values: Obj, tmp_path: Path) -> list[Obj]:
    helm = BIN / "helm"
    assert helm.exists(), f"no helm in {BIN}: run hack/cluster/build-binaries.sh"
    path = tmp_path / "monitoring-values.json"
    path.write_text(json.dumps(values))
    proc = subprocess.run([str(helm), "template", "mwo", str(CHART), "-n", "ops", "-f", str(path)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def chart_rule_groups(tmp_path: Path) -> list[Obj]:
    """The PrometheusRule's groups as the chart renders them."""
    objs = render_chart({"metrics": {"prometheusRule": {"enabled": True}}}, tmp_path)
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert len(rules) == 1, f"expected one PrometheusRule, got {len(rules)}"
    groups: list[Obj] = rules[0]["spec"]["groups"]
    return groups


def write_rule_file(tmp_path: Path, groups: list[Obj]) -> Path:
    path = tmp_path / "multiworker-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def alerts(groups: list[Obj]) -> dict[str, Obj]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the chart's dashboard."""
    board = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"]
            for target in panel.get("targets", [])]
