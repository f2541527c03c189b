"""The Helm chart rendered by the real helm binary, checked object by object (no cluster).

What the API server thinks of the output is tests/integration/test_helm.py's job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from multiworker.api import names
from multiworker.clients.footprint import (
    FOOTPRINT,
    KUEUE_CLUSTER_FOOTPRINT,
    KUEUE_FOOTPRINT,
    NODE_LEASE_FOOTPRINT,
)

from tests.cluster import BIN, REPO

CHART = REPO / "charts" / "multiworker-operator"
RELEASE, NAMESPACE = "mwo", "ops"
Obj = dict[str, Any]


def helm_path() -> str:
    found = shutil.which("helm", path=str(BIN)) or shutil.which("helm")
    if not found:
        pytest.skip(f"no helm binary in {BIN} or PATH (hack/cluster/build-binaries.sh builds it)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [helm_path(), *args]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def template(tmp_path: Path, values: Obj | None = None, *extra: str) -> list[Obj]:
    """Render the chart with `values` on top of values.yaml; return the objects."""
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values or {}))
    out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(path), *extra).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(objs: list[Obj], kind: str, namespace: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind
             and (namespace is None or o["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"expected one {kind} in {namespace}, got {len(found)}"
    return found[0]


def kinds(objs: list[Obj]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def container(objs: list[Obj]) -> Obj:
    containers: list[Obj] = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def rules(role: Obj) -> set[tuple[str, str, str]]:
    """A Role's rules flattened to (apiGroup, resource, verb) triples."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def triples(groups: list[str], resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g in groups for r in resources for v in verbs}


# The operator's whole API footprint, from the code (clients/footprint.py): namespaced, and nodes.
JOB_RULES = {(group, resource, verb) for (group, resource), verbs in FOOTPRINT.items()
             if resource != "nodes" for verb in verbs}
CLUSTER_SCOPED_RULES = triples([""], ["nodes"], ["get", "list", "watch"]) | {("", "pods", "list")}  # elastic room
NODE_LEASE_RULES = {(group, resource, verb)
                    for (group, resource), verbs in NODE_LEASE_FOOTPRINT.items()
                    for verb in verbs}


def test_default_is_cluster_wide_with_leader_election(tmp_path: Path) -> None:
    """The RBAC grants exactly what the code calls (clients/footprint.py): no more, no less."""
    objs = template(tmp_path)
    assert kinds(objs) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service",
        "ServiceAccount",
    ]
    assert rules(one(objs, "ClusterRole")) == CLUSTER_SCOPED_RULES | JOB_RULES
    assert rules(one(objs, "Role", "kube-node-lease")) == NODE_LEASE_RULES
    assert one(objs, "RoleBinding", "kube-node-lease")["roleRef"]["name"] == \
        one(objs, "Role", "kube-node-lease")["metadata"]["name"]
    args = container(objs)["args"]
    assert "--all-namespaces" in args and "--standalone" not in args
    assert not [a for a in args if a.startswith(("--namespace", "--peering"))]
    assert {"--kube-api-qps=500", "--kube-api-burst=1000", "--request-timeout=30"} <= set(args)
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    env = {e["name"]: e for e in container(objs)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_only_the_operators_own_lease_can_be_read_or_updated(tmp_path: Path) -> None:
    """Leader election needs one Lease per namespace; the rules must not reach any other
    (kube-system's controller-manager and scheduler Leases, say). The nodes' Leases are read
    (never written) in kube-node-lease alone."""
    for values in ({}, {"watchNamespaces": ["a"]}):
        for role in (o for o in template(tmp_path, values) if o["kind"] in ("Role", "ClusterRole")):
            for rule in role["rules"]:
                if "leases" not in rule["resources"]:
                    continue
                if role["metadata"].get("namespace") == "kube-node-lease":
                    assert set(rule["verbs"]) == {"get", "list", "watch"}, rule
                elif set(rule["verbs"]) - {"create"}:
                    assert rule.get("resourceNames") == [names.LEASE_NAME], rule


def test_namespaced_mode_grants_only_the_watched_namespaces(tmp_path: Path) -> None:
    objs = template(tmp_path, {"watchNamespaces": ["team-a", "team-b"]})
    assert rules(one(objs, "ClusterRole")) == CLUSTER_SCOPED_RULES
    for ns in ("team-a", "team-b"):
        assert rules(one(objs, "Role", ns)) == JOB_RULES
        binding = one(objs, "RoleBinding", ns)
        assert binding["roleRef"]["name"] == one(objs, "Role", ns)["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "mwo-multiworker-operator", "namespace": NAMESPACE}
        ]
    args = container(objs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b",
    ]
    assert "--all-namespaces" not in args


def test_cluster_role_binds_the_service_account(tmp_path: Path) -> None:
    objs = template(tmp_path)
    account = one(objs, "ServiceAccount")
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(objs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{
        "kind": "ServiceAccount",
        "name": account["metadata"]["name"],
        "namespace": NAMESPACE,
    }]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    # Release names are unique per namespace only: cluster-scoped names carry the namespace.
    assert binding["metadata"]["name"] == f"{NAMESPACE}:mwo-multiworker-operator"


def test_ha_replicas_need_nothing_more(tmp_path: Path) -> None:
    """Leader election (Leases) is on in every mode, so HA is only a replica count."""
    objs = template(tmp_path, {"replicaCount": 3, "watchNamespaces": ["a"]})
    assert one(objs, "Deployment")["spec"]["replicas"] == 3
    assert rules(one(objs, "Role", "a")) == JOB_RULES
    assert not [o for o in objs if o["kind"].endswith("KopfPeering")]


def test_client_limits_reach_the_command_line(tmp_path: Path) -> None:
    values = {"kubeApi": {"qps": 5, "burst": 10, "requestTimeoutSeconds": 7, "concurrency": 4},
              "reconcileWorkers": 2}
    args = container(template(tmp_path, values))["args"]
    assert {"--kube-api-qps=5", "--kube-api-burst=10", "--request-timeout=7",
            "--api-concurrency=4", "--workers=2"} <= set(args)


def test_no_wildcards_and_no_secrets_but_the_agents_keys(tmp_path: Path) -> None:
    for values in ({}, {"watchNamespaces": ["a"], "replicaCount": 2}):
        for role in (o for o in template(tmp_path, values) if o["kind"] in ("Role", "ClusterRole")):
            for group, resource, verb in rules(role):
                assert "*" not in (group, resource, verb)
                # Secrets: the in-place agents' keys, created and read by name; never listed
                # or watched, so no other Secret is ever sent to the operator.
                assert resource != "secrets" or verb in ("create", "get")
                # ConfigMaps: created (TF_CONFIG's addresses), never read or changed.
                assert resource != "configmaps" or verb == "create"
                assert verb not in ("escalate", "bind", "impersonate")
                # A restart's pods go by label selector: a bulk form of list + delete on pods,
                # which the operator has anyway; on nothing else.
                assert verb != "deletecollection" or resource == "pods"


def test_container_is_locked_down(tmp_path: Path) -> None:
    objs = template(tmp_path)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(objs)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert c["image"] == "multiworker.local/operator:dev"
    assert c["imagePullPolicy"] == "IfNotPresent"


def test_probes_use_the_liveness_endpoint(tmp_path: Path) -> None:
    c = container(template(tmp_path, {"health": {"port": 9999}}))
    assert "--health-port=9999" in c["args"]
    assert {"name": "health", "containerPort": 9999, "protocol": "TCP"} in c["ports"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_logging_and_extra_args_reach_the_command_line(tmp_path: Path) -> None:
    values = {"logging": {"level": "debug", "format": "json"}, "extraArgs": ["--x=1"]}
    args = container(template(tmp_path, values))["args"]
    assert "--log-level=debug" in args and "--log-format=json" in args
    assert args[-1] == "--x=1"


def test_gang_scheduling_default_reaches_the_command_line(tmp_path: Path) -> None:
    assert "--default-gang-scheduling" not in container(template(tmp_path))["args"]
    args = container(template(tmp_path, {"gangScheduling": {"default": True}}))["args"]
    assert "--default-gang-scheduling" in args


def test_worker_network_policy_reaches_the_command_line(tmp_path: Path) -> None:
    assert "--worker-network-policy" not in container(template(tmp_path))["args"]
    args = container(template(tmp_path, {"workerNetworkPolicy": {"enabled": True}}))["args"]
    assert "--worker-network-policy" in args
    env = {e["name"] for e in container(template(tmp_path))["env"]}
    assert "POD_NAMESPACE" in env  # where the policy lets the operator's pods in from


def test_kueue_adds_its_flag_and_exactly_the_kueue_calls(tmp_path: Path) -> None:
    """kueue.enabled: --kueue, and the Kueue calls (KUEUE_FOOTPRINT) on top of the rest, in
    both modes: namespaced ones in each watched namespace, flavors and classes cluster-wide."""
    def triples_of(footprint: dict[tuple[str, str], frozenset[str]]) -> set[tuple[str, ...]]:
        return {(g, r, v) for (g, r), verbs in footprint.items() for v in verbs}

    assert "--kueue" not in container(template(tmp_path))["args"]
    objs = template(tmp_path, {"kueue": {"enabled": True}})
    assert "--kueue" in container(objs)["args"]
    assert rules(one(objs, "ClusterRole")) == CLUSTER_SCOPED_RULES | JOB_RULES | \
        triples_of(KUEUE_FOOTPRINT) | triples_of(KUEUE_CLUSTER_FOOTPRINT)
    objs = template(tmp_path, {"kueue": {"enabled": True}, "watchNamespaces": ["team-a"]})
    assert triples_of(KUEUE_FOOTPRINT) <= rules(one(objs, "Role", "team-a"))
    assert not triples_of(KUEUE_CLUSTER_FOOTPRINT) & rules(one(objs, "Role", "team-a"))
    cluster_roles = [o for o in objs if o["kind"] == "ClusterRole"]
    assert any(triples_of(KUEUE_CLUSTER_FOOTPRINT) <= rules(r) for r in cluster_roles)


def test_metrics_service_and_optional_service_monitor(tmp_path: Path) -> None:
    objs = template(tmp_path, {"metrics": {"port": 9102}})
    service = one(objs, "Service")
    assert service["metadata"]["name"] == "mwo-multiworker-operator-metrics"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9102, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == one(objs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert "--metrics-port=9102" in container(objs)["args"]
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]

    monitor = one(template(tmp_path, {"metrics": {"serviceMonitor": {
        "enabled": True, "labels": {"release": "prom"}}}}), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_scheduling_values_reach_the_pod(tmp_path: Path) -> None:
    values = {
        "nodeSelector": {"role": "system"},
        "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeLossTolerationSeconds": None,
        "affinity": {"nodeAffinity": {"x": 1}},
        "priorityClassName": "system-cluster-critical",
    }
    pod = one(template(tmp_path, values), "Deployment")["spec"]["template"]["spec"]
    for key, value in values.items():
        if key != "nodeLossTolerationSeconds":
            assert pod[key] == value


def test_by_default_a_lost_node_costs_the_operator_a_lease_takeover_not_minutes(
    tmp_path: Path,
) -> None:
    """Two replicas, preferably on different nodes and away from training pods; each evicted
    30 s after its node turns NotReady or unreachable (Kubernetes' default is 300 s)."""
    pod_spec = one(template(tmp_path), "Deployment")["spec"]
    assert pod_spec["replicas"] == 2
    pod = pod_spec["template"]["spec"]
    assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in pod["tolerations"]} == {
        ("node.kubernetes.io/not-ready", "NoExecute", 30),
        ("node.kubernetes.io/unreachable", "NoExecute", 30)}
    terms = [t["podAffinityTerm"] for t in
             pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]]
    assert terms[0]["labelSelector"]["matchLabels"] == \
        pod_spec["selector"]["matchLabels"]
    assert terms[1]["labelSelector"]["matchExpressions"][0]["key"] == names.LABEL_JOB_NAME
    assert {t["topologyKey"] for t in terms} == {"kubernetes.io/hostname"}
    # The user's own choices replace the defaults.
    mine = one(template(tmp_path, {"replicaCount": 1, "nodeLossTolerationSeconds": None,
                                   "affinity": {"nodeAffinity": {"x": 1}}}),
               "Deployment")["spec"]
    assert mine["replicas"] == 1 and "tolerations" not in mine["template"]["spec"]
    assert mine["template"]["spec"]["affinity"] == {"nodeAffinity": {"x": 1}}


def test_schema_rejects_typos_and_bad_values(tmp_path: Path) -> None:
    for bad in ({"replicas": 2}, {"logging": {"level": "loud"}}, {"replicaCount": 0},
                {"watchNamespaces": ["Not_A_Namespace"]}, {"gangScheduling": {"default": "yes"}},
                {"gangScheduling": {"enabled": True}}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        proc = helm("template", RELEASE, str(CHART), "-f", str(path), check=False)
        assert proc.returncode != 0, f"{bad} was accepted"
        assert "schema" in proc.stderr.lower()


def test_crds_come_from_the_repository_crds_directory(tmp_path: Path) -> None:
    """The chart ships the generated CRD itself: a copy `make generate` writes and `make verify`
    compares, never a hand-kept one, and a real file (Helm warns about a symlink on every
    install: "found symbolic link in path")."""
    copy = CHART / "crds" / "multiworker.dev_multiworkerjobs.yaml"
    assert not copy.is_symlink()
    assert copy.read_bytes() == (REPO / "crds" / "multiworker.dev_multiworkerjobs.yaml").read_bytes()
    assert "symbolic link" not in helm("template", RELEASE, str(CHART), "--include-crds").stderr
    objs = template(tmp_path, {}, "--include-crds")
    crds = {o["metadata"]["name"]: o for o in objs if o["kind"] == "CustomResourceDefinition"}
    assert set(crds) == {"multiworkerjobs.multiworker.dev"}
    source = yaml.safe_load((REPO / "crds" / "multiworker.dev_multiworkerjobs.yaml").read_text())
    assert crds["multiworkerjobs.multiworker.dev"] == source


def test_every_value_is_documented() -> None:
    """Every value in values.yaml has a comment above it (siblings may share one comment).

    Section headers (`metrics:` with nested keys) and keys inside free-form Kubernetes objects
    (resources, security contexts) are exempt: their contents are what carry meaning.
    """
    free_form = ("resources", "podSecurityContext", "securityContext")
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")
    undocumented, inside = [], None
    for i, line in enumerate(lines):
        m = key.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        if indent == 0:
            inside = m.group(2) if m.group(2) in free_form else None
        elif inside:
            continue
        if not line[m.end():].strip():
            continue  # a section header
        j = i - 1
        while j >= 0 and (m2 := key.match(lines[j])) and len(m2.group(1)) == indent:
            j -= 1  # a sibling directly above: share its comment
        above = lines[j] if j >= 0 else ""
        if not (above.strip().startswith("#") and len(above) - len(above.lstrip()) == indent):
            undocumented.append(f"line {i + 1}: {line.strip()}")
    assert not undocumented, "values without a comment:\n" + "\n".join(undocumented)


def test_alerts_and_dashboard_are_rendered_only_when_enabled(tmp_path: Path) -> None:
    objs = template(tmp_path)
    assert not [o for o in objs if o["kind"] == "PrometheusRule"]
    assert not [o for o in objs if o["kind"] == "ConfigMap"]

    objs = template(tmp_path, {"metrics": {
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"},
                           "runbookUrl": "https://docs.example/runbooks/"},
        "dashboard": {"enabled": True, "labels": {"team": "ml"},
                      "annotations": {"grafana_folder": "Training"}}}})
    rule = one(objs, "PrometheusRule", NAMESPACE)
    assert rule["metadata"]["name"] == "mwo-multiworker-operator"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == [
        "MultiWorkerJobNotStarting", "MultiWorkerJobProgressStalled",
        "MultiWorkerJobRestartLoop", "MultiWorkerNamespaceWithoutLeader",
        "MultiWorkerOperatorAPIServerErrors", "MultiWorkerOperatorDown",
        "MultiWorkerReconcileErrors",
    ]
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == \
            f"https://docs.example/runbooks/#{name.lower()}"
    # Prometheus' own templates reach the rule untouched by Helm.
    assert "{{ $labels.job_name }}" in alerts["MultiWorkerJobRestartLoop"]["annotations"]["summary"]

    dashboard = one(objs, "ConfigMap", NAMESPACE)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["labels"]["team"] == "ml"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert json.loads(dashboard["data"]["multiworker.json"]) == json.loads(
        (CHART / "dashboards" / "multiworker.json").read_text())

    moved = template(tmp_path, {"metrics": {"dashboard": {"enabled": True,
                                                          "namespace": "monitoring"}}})
    assert one(moved, "ConfigMap")["metadata"]["namespace"] == "monitoring"
