"""Each operator under test talks to the API server as its own user, so the API server itself
can say how many requests each one made, whatever client library or metrics it has.

How: a client certificate per operator (CN mw-bench:<name>, O mw-bench), signed by the local
cluster's CA (.cluster/pki), bound to cluster-admin, and a FlowSchema per user. API Priority and
Fairness classifies every request, watches included, and counts it in
`apiserver_flowcontrol_dispatched_requests_total{flow_schema="mw-bench-<name>"}`: a count at the
API server of exactly that operator's requests. Its priority level is workload-low, where a
service-account operator lands by default (flow schema service-accounts); on this quiet cluster
nothing queues. The audit log would say the same but needs API server flags; client-side
counters (client-go's rest_client_requests_total) are read too where an operator exposes them.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import yaml

from tests.bench.harness import Cluster

GROUP_NAME = "mw-bench"
PRIORITY_LEVEL = "workload-low"
PRECEDENCE = 1000  # after the system schemas (< 1000), before service-accounts and global-default


def user(name: str) -> str:
    return f"{GROUP_NAME}:{name}"


def flow_schema(name: str) -> str:
    return f"{GROUP_NAME}-{name}"


def kubeconfig_for(name: str, admin_kubeconfig: Path) -> Path:
    """A kubeconfig for `name`'s own certificate (made once per cluster CA), beside the
    cluster's admin kubeconfig (.cluster/)."""
    cluster_dir = admin_kubeconfig.parent
    pki, out = cluster_dir / "pki", cluster_dir / "bench"
    server = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    out.mkdir(exist_ok=True)
    key, crt, path = out / f"{name}.key", out / f"{name}.crt", out / f"{name}.kubeconfig"
    fresh = crt.exists() and subprocess.run(
        ["openssl", "verify", "-CAfile", str(pki / "ca.crt"), str(crt)],
        capture_output=True, check=False).returncode == 0
    if not fresh or not path.exists():
        subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(key), "-subj", f"/O={GROUP_NAME}/CN={user(name)}", "-out",
                        str(out / f"{name}.csr")], capture_output=True, check=True)
        ext = out / "client.ext"
        ext.write_text("extendedKeyUsage=clientAuth\n")
        subprocess.run(["openssl", "x509", "-req", "-in", str(out / f"{name}.csr"), "-CA",
                        str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"), "-CAcreateserial",
                        "-days", "365", "-extfile", str(ext), "-out", str(crt)],
                       capture_output=True, check=True)
        path.write_text(json.dumps(_kubeconfig(name, server, pki / "ca.crt", crt, key)))
        path.chmod(0o600)
        key.chmod(0o600)
    return path


def _kubeconfig(name: str, server: str, ca: Path, crt: Path, key: Path) -> dict[str, object]:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority-data": b64(ca)}}],
        "users": [{"name": name, "user": {"client-certificate-data": b64(crt),
                                          "client-key-data": b64(key)}}],
        "contexts": [{"name": "bench", "context": {"cluster": "local", "user": name}}],
    }


def install(cluster: Cluster, names: list[str]) -> None:
    """The RBAC binding and one FlowSchema per operator (idempotent)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": GROUP_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": GROUP_NAME}],
    }
    schemas = [{
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": flow_schema(n)},
        "spec": {
            "priorityLevelConfiguration": {"name": PRIORITY_LEVEL},
            "matchingPrecedence": PRECEDENCE,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": user(n)}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "clusterScope": True, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    } for n in names]
    manifest = {"apiVersion": "v1", "kind": "List", "items": [binding, *schemas]}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))


class ApiServerCounts:
    """Counters read from the API server's /metrics."""

    def __init__(self, text: str) -> None:
        self.total = 0.0
        self.by_flow_schema: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("apiserver_request_total{"):
                self.total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
                labels = _labels(line)
                schema = labels.get("flow_schema", "")
                self.by_flow_schema[schema] = (self.by_flow_schema.get(schema, 0.0)
                                               + float(line.rsplit(" ", 1)[1]))

    @classmethod
    def read(cls, cluster: Cluster) -> ApiServerCounts:
        return cls(cluster.kubectl("get", "--raw", "/metrics"))

    def of(self, name: str) -> float:
        return self.by_flow_schema.get(flow_schema(name), 0.0)


def _labels(line: str) -> dict[str, str]:
    inside = line[line.index("{") + 1:line.rindex("}")]
    pairs = (p.split("=", 1) for p in inside.split('",') if "=" in p)
    return {k: v.strip('"') for k, v in pairs}


def scrape_sum(port: int | None, families: tuple[str, ...], where: str = "") -> float | None:
    """Sum of every sample of the first of `families` that an operator's /metrics has (None
    when it has none of them, or serves no metrics); `where`: only samples whose labels
    contain it (e.g. 'resource="pods"')."""
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for family in families:
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith((family + "{", family + " ")) and where in line]
        if values:
            return sum(values)
    return None
