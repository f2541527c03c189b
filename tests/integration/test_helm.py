"""The Helm chart against the real cluster with the real helm binary: lint, server-side
validation of the rendered objects, install → Available → upgrade → uninstall, metrics, HA.

Every release watches only its own test namespace, so an installed operator never touches
other tests' jobs. Cluster-scoped leftovers are removed by `helm uninstall` in a finalizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster import REPO, Cluster
from tests.integration.helm import CHART, CRD_NAMES, Helm, Obj, Release, values_file
from tests.integration.jobs import Jobs, job
from tests.support import wait_for

# What the operator exports (operator/src/multiworker/clients/metrics.py); a scrape must show them all.
OPERATOR_METRICS = ("multiworker_jobs", "multiworker_group_restarts_total")


# ---------------------------------------------------------------------------------------------
# Static checks: lint, and the rendered objects as the API server sees them.

MODES: dict[str, Obj] = {
    "cluster-wide": {},
    "namespaced": {"watchNamespaces": ["NS"]},
    "cluster-wide-ha": {"replicaCount": 2},
    "namespaced-ha": {"replicaCount": 2, "watchNamespaces": ["NS"]},
    "everything-on": {
        "replicaCount": 2,
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                    "dashboard": {"enabled": True}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "x", "operator": "Exists", "effect": "NoSchedule"}],
        "extraArgs": ["--log-level=debug"],
        "extraEnv": [{"name": "X", "value": "1"}],
    },
}


def with_namespace(values: Obj, namespace: str) -> Obj:
    if "watchNamespaces" in values:
        return {**values, "watchNamespaces": [namespace]}
    return values


@pytest.mark.parametrize("mode", sorted(MODES))
def test_lint_strict(helm_home: Path, tmp_path: Path, mode: str) -> None:
    """Lint needs no cluster."""
    values = values_file(tmp_path, with_namespace(MODES[mode], "watched"))
    proc = Helm(dict(os.environ), helm_home)("lint", "--strict", str(CHART), "-f", values)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.usefixtures("chart_crds", "monitoring_crds")
def test_template_accepted_by_api_server(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path, mode: str
) -> None:
    values = with_namespace(MODES[mode], namespace)
    rendered = helm("template", "mwo", str(CHART), "-n", namespace,
                    "-f", values_file(tmp_path, values), "--include-crds").stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole"} <= kinds
    # No -n: every namespaced object names its namespace (the Role for node Leases lives in
    # kube-node-lease), as `helm install` applies them.
    proc = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict",
                           "-f", "-", input=rendered)
    assert "(server dry run)" in proc.stdout


MONITORING_CRDS = ("servicemonitors", "prometheusrules")


@pytest.fixture(scope="session")
def monitoring_crds(cluster: Cluster) -> None:
    """ServiceMonitor and PrometheusRule, the CRDs as prometheus-operator's Go module ships
    them (versions.env pins it); installed for the chart's objects, no operator runs."""
    version = next(line.split("=", 1)[1] for line in
                   (REPO / "hack/cluster/versions.env").read_text().splitlines()
                   if line.startswith("PROMETHEUS_OPERATOR_VERSION="))
    found = subprocess.run(
        ["go", "mod", "download", "-json",
         f"github.com/prometheus-operator/prometheus-operator@{version}"],
        check=True, capture_output=True, text=True, timeout=600,
        env={**os.environ, "GOFLAGS": "-mod=mod"})
    crds = Path(json.loads(found.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    for plural in MONITORING_CRDS:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                        str(crds / f"monitoring.coreos.com_{plural}.yaml"))
    cluster.wait_established(*(f"{p}.monitoring.coreos.com" for p in MONITORING_CRDS))


# ---------------------------------------------------------------------------------------------
# The chart installed for real.

def test_install_upgrade_uninstall(release: Release, tmp_path: Path) -> None:
    ns, cluster = release.namespace, release.cluster
    release.install({"watchNamespaces": [ns]}, tmp_path)
    release.wait_rolled_out()
    cluster.wait_established(*CRD_NAMES, timeout=30)
    assert "--log-level=info" in operator_args(release)

    installed = owned_objects(release)
    assert {kind for kind, _, _ in installed} == {
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service",
        "ServiceAccount",
    }

    release.helm("upgrade", release.name, str(CHART), "-n", ns, "--reuse-values",
                 "--set", "logging.level=debug")
    wait_for(lambda: "--log-level=debug" in operator_args(release), 30, interval=1,
             describe="the upgraded Deployment spec")
    release.wait_rolled_out()
    history = json.loads(release.helm("history", release.name, "-n", ns, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

    release.helm("uninstall", release.name, "-n", ns, "--wait", "--timeout=120s")
    for kind, namespace, name in installed:
        scope = ("-n", namespace) if namespace else ()
        gone = cluster.kubectl(*scope, "get", kind, name, "--ignore-not-found", "-o", "name")
        assert not gone.stdout.strip(), f"{kind} {name} survived helm uninstall"
    # CRDs from crds/ are never deleted by helm: deleting one would delete every job with it.
    cluster.kubectl("get", "crd", *CRD_NAMES)


def operator_args(release: Release) -> list[str]:
    containers = release.deployment()["spec"]["template"]["spec"]["containers"]
    args: list[str] = containers[0]["args"]
    return args


def owned_objects(release: Release) -> list[tuple[str, str, str]]:
    """(kind, namespace or "", name) of every object in the release's manifest."""
    manifest = release.helm("get", "manifest", release.name, "-n", release.namespace).stdout
    return [
        (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        for doc in yaml.safe_load_all(manifest) if doc
    ]


@pytest.mark.usefixtures("monitoring_crds")
def test_install_with_alerts_dashboard_and_service_monitor(
        release: Release, tmp_path: Path) -> None:
    """Everything monitoring-related on: the API server takes the PrometheusRule (its CRD's
    schema), the ServiceMonitor and the dashboard ConfigMap, and uninstall removes them."""
    release.install({"watchNamespaces": [release.namespace], "metrics": {
        "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True}}}, tmp_path)
    release.wait_rolled_out()
    installed = owned_objects(release)
    kinds = {kind for kind, _, _ in installed}
    assert {"PrometheusRule", "ServiceMonitor", "ConfigMap"} <= kinds, kinds
    ns = release.namespace
    rule = next(name for kind, _, name in installed if kind == "PrometheusRule")
    groups = json.loads(release.cluster.kubectl(
        "-n", ns, "get", "prometheusrule", rule, "-o", "json").stdout)["spec"]["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert "MultiWorkerJobRestartLoop" in alerts, alerts
    dashboard = next(name for kind, _, name in installed if kind == "ConfigMap")
    labels = json.loads(release.cluster.kubectl(
        "-n", ns, "get", "configmap", dashboard, "-o", "json").stdout)["metadata"]["labels"]
    assert labels.get("grafana_dashboard") == "1", labels
    release.helm("uninstall", release.name, "-n", ns, "--wait", "--timeout=120s")
    for kind, namespace, name in installed:
        scope = ("-n", namespace) if namespace else ()
        gone = release.cluster.kubectl(*scope, "get", kind, name, "--ignore-not-found",
                                       "-o", "name")
        assert not gone.stdout.strip(), f"{kind} {name} survived helm uninstall"


def test_metrics_are_scraped_through_the_service(release: Release, tmp_path: Path) -> None:
    release.install({"watchNamespaces": [release.namespace]}, tmp_path)
    release.wait_rolled_out()
    path = (f"/api/v1/namespaces/{release.namespace}/services/"
            f"http:{release.fullname}-metrics:metrics/proxy/metrics")
    last: list[str] = [""]

    def scrape() -> str | None:
        proc = release.cluster.kubectl("get", "--raw", path, check=False)
        last[0] = proc.stdout + proc.stderr
        return proc.stdout if proc.returncode == 0 else None

    text = wait_for(scrape, 60, interval=1, describe=lambda: f"a /metrics scrape: {last[0]}")
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    missing = [m for m in OPERATOR_METRICS if m not in exported
               and m.removesuffix("_total") not in exported]  # counters: TYPE has no _total
    assert not missing, f"metrics missing from the scrape: {missing}\n{text}"


@pytest.mark.usefixtures("images")
def test_chart_rbac_is_enough_for_a_job_lifetime(
    release: Release, jobs: Jobs, tmp_path: Path
) -> None:
    """The operator, with only the chart's RBAC, runs a job from creation to TTL deletion:
    watch jobs and pods, create the Service and pods, patch status, post Events, delete."""
    release.install({"watchNamespaces": [release.namespace]}, tmp_path)
    release.wait_rolled_out()
    jobs.apply(job("rbac", "sleep 1; exit 0", workers=2, ttlSecondsAfterFinished=3))
    jobs.wait_phase("rbac", "Succeeded")
    assert jobs.events("rbac"), "the operator posted no Events"
    wait_for(lambda: jobs.get("rbac") is None, 60, interval=1,
             describe="the job to be deleted after ttlSecondsAfterFinished")
    logs = release.logs()
    denied = [line for line in logs.splitlines() if "forbidden" in line.lower()]
    assert not denied, "the operator was denied:\n" + "\n".join(denied)


def ha_holder(release: Release, jobs: Jobs, tmp_path: Path, values: Obj, name: str,
              workers: int) -> tuple[str, str]:
    """Installs two replicas, runs job `name` and returns (Lease holder, standby)."""
    release.install(values, tmp_path)
    release.wait_rolled_out()
    pods = set(release.pod_names())
    assert len(pods) == 2
    jobs.apply(job(name, "exec sleep 3600", workers=workers))
    jobs.wait_phase(name, "Running", timeout=60)
    holder = wait_for(release.lease_holder, 30, interval=1, describe="a Lease holder")
    assert holder in pods
    (standby,) = pods - {holder}
    return holder, standby


@pytest.mark.usefixtures("images")
def test_ha_exactly_one_replica_acts_and_says_so(
    release: Release, jobs: Jobs, tmp_path: Path
) -> None:
    """Two replicas: the Lease holder handles the job; the other waits, says so in its log and
    exports 0 leading namespaces."""
    holder, standby = ha_holder(
        release, jobs, tmp_path, {"replicaCount": 2, "watchNamespaces": [release.namespace]},
        "ha", workers=1)
    wait_for(lambda: release.pod_metric(holder, "multiworker_leading_namespaces") == 1, 30,
             interval=1, describe="the holder to export one leading namespace")
    assert release.pod_metric(standby, "multiworker_leading_namespaces") == 0
    says = f"{holder} holds its Lease multiworker-operator): this instance waits"
    wait_for(lambda: says in release.kubectl("logs", standby).stdout, 30, interval=1,
             describe=f"the standby {standby} to log that it waits")


def host_pids(pod: str) -> list[int]:
    """The processes of `pod`'s operator container (tini and the operator), as this host sees
    them (the local cluster's containers are this machine's processes): by POD_NAME, which the
    chart sets."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"POD_NAME={pod}".encode() in environ and b"multiworker-operator" in cmdline:
            found.append(int(entry.name))
    assert found, f"no operator process of {pod} on this host"
    return found


@pytest.mark.usefixtures("images")
def test_ha_a_frozen_leader_is_replaced_by_the_standby(
    release: Release, jobs: Jobs, tmp_path: Path, cluster: Cluster
) -> None:
    """The chart's defaults (2 replicas): the holder's process stops dead (SIGSTOP: its node
    froze) and the standby takes the Lease over and acts — a worker deleted meanwhile is
    replaced by a new group; the old holder, continued, acts no more."""
    if cluster.kind != "local":
        pytest.skip("the operator's processes are this host's on the local cluster only")
    # The chart's defaults: no replicaCount given.
    holder, standby = ha_holder(release, jobs, tmp_path, {"watchNamespaces": [release.namespace]},
                                "takeover", workers=2)
    pids = host_pids(holder)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        wait_for(lambda: release.lease_holder() == standby, 60, interval=0.5,
                 describe=f"the standby {standby} to take the Lease over")
        took = time.monotonic() - frozen
        jobs.kubectl("delete", "pod", "takeover-worker-1", "--wait=false")
        jobs.wait("takeover", "a new group made by the standby",
                  lambda s: s if s.get("groupGeneration") == 1 else None, timeout=60)
        print(f"\nleader frozen -> standby holds the Lease in {took:.1f}s; new group "
              f"{time.monotonic() - frozen:.1f}s after the freeze")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # the kubelet may have killed it
                os.kill(pid, signal.SIGCONT)
    assert release.lease_holder() == standby
