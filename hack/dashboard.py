"""The operator's Grafana dashboard, built with Grafana's foundation SDK (grafana-foundation-sdk,
pinned in operator/pyproject.toml's test extras), printed as JSON.

    .venv/bin/python hack/dashboard.py > charts/multiworker-operator/dashboards/multiworker.json

The chart ships that file as a ConfigMap for Grafana's dashboard sidecar (metrics.dashboard);
tests/unit/test_dashboard.py fails when it differs from what this prints, and
tests/integration/test_alerts.py runs every query below against a real Prometheus scraping a
real operator (each must return data). Only metrics the operator exports
(operator/src/multiworker/clients/metrics.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

UID = "multiworker-operator"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
JOB = "{{job_namespace}}/{{job_name}}"


def quantile(q: float, histogram: str, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({histogram}_bucket[{RATE}])))"


@dataclass(frozen=True)
class Chart:
    """One time-series panel: a title, what it shows, its unit and its queries (expr, legend)."""

    title: str
    description: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    stacked: bool = False
    bars: bool = False


ROWS: tuple[tuple[str, tuple[Chart, ...]], ...] = (
    ("Jobs", (
        Chart("Jobs by phase", "MultiWorkerJobs handled by the operator, by status.phase.",
              "short", (("sum by (phase) (multiworker_jobs)", "{{phase}}"),), stacked=True),
        Chart("Group size: ready and desired workers",
              "Per job: workers of the current group that run and are ready "
              "(status.readyWorkers) against spec.workers.", "short",
              (("max by (job_namespace, job_name) (multiworker_job_ready_workers)",
                f"{JOB} ready"),
               ("max by (job_namespace, job_name) (multiworker_job_workers)",
                f"{JOB} desired"))),
        Chart("Training step", "Per job: the chief's latest step (status.progress.step); "
              "a flat line while Running is a stall.", "short",
              (("max by (job_namespace, job_name) (multiworker_job_progress_step)", JOB),)),
        Chart("Start-up time (p50, p90)", "From a job's creation to all workers of its first "
              "group running.", "s",
              ((quantile(0.5, "multiworker_startup_seconds"), "p50"),
               (quantile(0.9, "multiworker_startup_seconds"), "p90"))),
    )),
    ("Restarts and recovery", (
        Chart("Group restarts by reason", "Whole-group restarts, by the first failed "
              "worker's reason; counted=false did not spend the job's budget (disruptions).",
              "short",
              ((f"sum by (reason, counted) (increase(multiworker_group_restarts_total[{RATE}]))",
                "{{reason}} (counted={{counted}})"),), stacked=True, bars=True),
        Chart("Restarts spent per job", "Per job: restarts spent from "
              "spec.restartPolicy.maxRestarts (status.restarts).", "short",
              (("max by (job_namespace, job_name) (multiworker_job_restarts)", JOB),)),
        Chart("Recovery time (p50, p90)", "From a failure observed to all workers of the new "
              "group running.", "s",
              ((quantile(0.5, "multiworker_recovery_seconds"), "p50"),
               (quantile(0.9, "multiworker_recovery_seconds"), "p90"))),
        Chart("Training steps lost", "Steps trained before a failure and trained again by the "
              "next group.", "short",
              ((f"sum(increase(multiworker_steps_lost_total[{RATE}]))", "steps lost"),),
              bars=True),
    )),
    ("Operator", (
        Chart("Leadership", "Per namespace with jobs: 1 while an instance holds its Lease "
              "(0: nobody handles its jobs); per instance: namespaces it handles.", "short",
              (("max by (job_namespace) (multiworker_namespace_leading)",
                "{{job_namespace}} led"),
               ("sum by (instance) (multiworker_leading_namespaces)",
                "{{instance}} leads"))),
        Chart("API server requests by code", "Requests to the Kubernetes API server per "
              "second; code=error is a connection error or a timeout.", "reqps",
              ((f"sum by (code) (rate(multiworker_api_requests_total[{RATE}]))", "{{code}}"),),
              stacked=True),
        Chart("Work queue depth", "Jobs due for a reconcile pass and waiting for a free pass "
              "worker.", "short",
              (("sum by (instance) (multiworker_workqueue_depth)", "{{instance}}"),)),
        Chart("Reconcile passes: errors and p90 duration", "Failed passes per second (each "
              "retried with backoff) and the 90th percentile of a pass's duration.", "short",
              ((f"sum by (instance) (rate(multiworker_reconcile_errors_total[{RATE}]))",
                "{{instance}} errors/s"),
               (quantile(0.9, "multiworker_reconcile_seconds", "le, instance"),
                "{{instance}} p90 seconds"))),
    )),
)


def panel(chart: Chart) -> timeseries.Panel:
    built = (timeseries.Panel().title(chart.title).description(chart.description)
             .unit(chart.unit).datasource(DATASOURCE).height(8).span(12)
             .legend(common_builders.VizLegendOptions().show_legend(True)
                     .display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM)))
    if chart.stacked:
        built = built.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if chart.bars:
        built = built.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    for ref, (expr, legend) in zip("ABCDEFGH", chart.queries, strict=False):
        built = built.with_target(prometheus.Dataquery().expr(expr).legend_format(legend)
                                  .ref_id(ref).datasource(DATASOURCE))
    return built


def build() -> dashboard.Dashboard:
    board = (dashboard.Dashboard("MultiWorkerJobs").uid(UID)
             .description("The multiworker operator: its jobs, their restarts and recovery, "
                          "and the operator's own health.")
             .tags(["multiworker", "kubernetes", "training"]).refresh("30s")
             .time("now-6h", "now").tooltip(DashboardCursorSync.CROSSHAIR)
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus")))
    for title, charts in ROWS:
        board = board.with_row(dashboard.Row(title))
        for chart in charts:
            board = board.with_panel(panel(chart))
    return board


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
