"""The chart's alerts and dashboard against a real Prometheus scraping the real operator.

Prometheus (built from its Go module: hack/cluster/build-prometheus.sh) runs as a host process
on 127.0.0.1 with its own temporary config and storage, scrapes the test's operator every
second and evaluates the chart's rules — the PrometheusRule's groups exactly as Helm renders
them, durations unchanged — every second. A job whose worker always exits 1 restarts in a loop
until MultiWorkerJobRestartLoop fires for it (3 restarts, then its 1 minute of `for`); a job
that trains (a fake progress server) stays quiet. Then every query of the chart's dashboard
returns data from that Prometheus (a number: a quantile of no observation, NaN, is no data).
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs, job
from tests.monitoring import (
    RUNBOOK_URL,
    chart_rule_groups,
    dashboard_queries,
    prometheus_binaries,
    write_rule_file,
)
from tests.support import free_port, wait_for

pytestmark = pytest.mark.usefixtures("images")

Obj = dict[str, Any]
# Grafana's interval variable, as Grafana would fill it in for a short range.
RATE_INTERVAL = "5m"
# A worker that serves GET /progress like the runtime does: one more step per poll.
TRAINER = """
exec python3 -c '
import http.server, json, os, time
index, generation = int(os.environ["MWJ_WORKER_INDEX"]), int(os.environ["MWJ_RESTART_COUNT"])
step = [0]
class Progress(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        step[0] += 1
        body = json.dumps({"workerIndex": index, "generation": generation, "phase": "training",
                           "step": step[0], "updatedAt": time.time()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("", int(os.environ["MWJ_PROGRESS_PORT"])), Progress).serve_forever()
'
"""


@dataclass
class Prometheus:
    """A Prometheus server on 127.0.0.1 (its own port) with a temporary config and storage."""

    binary: Path
    home: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self, targets: list[str], rule_file: Path) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(rule_file)],
            "scrape_configs": [{"job_name": "multiworker-operator",
                                "static_configs": [{"targets": targets}]}],
        }
        (self.home / "prometheus.yml").write_text(yaml.safe_dump(config))
        with (self.home / "prometheus.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config.file={self.home / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.home / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.home)
        wait_for(self.ready, 60, describe=lambda: f"Prometheus ready\n{self.log_tail()}")

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}{query}"
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]

    def alerts(self) -> list[Obj]:
        found: list[Obj] = self.api("alerts")["alerts"]
        return found

    def query(self, expr: str) -> list[Obj]:
        data = self.api("query", query=expr)
        result: list[Obj] = data["result"]
        return result

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        path = self.home / "prometheus.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    home = tmp_path / "prometheus"
    home.mkdir()
    server = Prometheus(prometheus_binaries()[1], home, free_port())
    yield server
    server.stop()


def test_a_restart_loop_fires_its_alert_and_every_dashboard_query_has_data(
    prometheus: Prometheus, operator: OperatorProcess, jobs: Jobs, tmp_path: Path,
) -> None:
    rules = write_rule_file(tmp_path, chart_rule_groups(tmp_path))
    prometheus.start([f"127.0.0.1:{operator.metrics_port}"], rules)
    # Scraped once before the jobs come (Prometheus applies its targets a few seconds after
    # it is ready): the start-up times observed next are increases it sees.
    wait_for(lambda: prometheus.query('up{job="multiworker-operator"} == 1'), 60,
             describe=lambda: f"a first scrape of the operator\n{prometheus.log_tail()}")
    jobs.apply(job("loop", "sleep 2; exit 1", workers=1,
                   restartPolicy={"maxRestarts": 100, "backoffSeconds": 0}))
    jobs.apply(job("train", TRAINER, workers=1))

    def firing() -> list[Obj]:
        return [a for a in prometheus.alerts()
                if a["labels"]["alertname"] == "MultiWorkerJobRestartLoop"
                and a["state"] == "firing"]

    def state() -> str:
        return (f"MultiWorkerJobRestartLoop firing\nalerts: {json.dumps(prometheus.alerts())}\n"
                f"restarts: {prometheus.query('multiworker_job_restarts')}\n"
                f"{jobs.describe('loop')}\n{prometheus.log_tail()}")

    # 3 restarts (a few seconds each), then the rule's unchanged `for: 1m`.
    alerts = wait_for(firing, 240, interval=2, describe=state)
    assert [a["labels"]["job_name"] for a in alerts] == ["loop"], alerts  # not the trainer
    alert = alerts[0]
    assert alert["labels"]["job_namespace"] == jobs.namespace
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"] == f"{RUNBOOK_URL}#multiworkerjobrestartloop"
    assert f"MultiWorkerJob {jobs.namespace}/loop restarted its worker group" in \
        alert["annotations"]["description"]
    assert jobs.status("loop")["restarts"] >= 3

    # The trainer's progress reaches status (every 10 s) and so the step series.
    wait_for(lambda: prometheus.query(
        f'multiworker_job_progress_step{{job_name="train",job_namespace="{jobs.namespace}"}}'),
        90, interval=2, describe=lambda: f"the trainer's step series\n{jobs.describe('train')}")
    empty = []
    for title, expr in dashboard_queries():
        result = prometheus.query(expr.replace("$__rate_interval", RATE_INTERVAL))
        print(f"{title}: {expr} -> {[(r['metric'], r['value'][1]) for r in result]}")
        if all(r["value"][1] == "NaN" for r in result):  # none, or quantiles of nothing
            empty.append(f"{title}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
