"""Run the test operator with nothing but the chart's RBAC: its ServiceAccount, Roles and
ClusterRole rendered by `helm template` for the test namespace, and a kubeconfig holding that
ServiceAccount's token. Every integration and e2e test then proves the chart grants enough."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import BIN, REPO, Cluster

CHART = REPO / "charts" / "multiworker-operator"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


@dataclass
class ChartIdentity:
    kubeconfig: Path
    # (kind, name, namespace or "") outside the test's namespace, to delete afterwards
    elsewhere: list[tuple[str, str, str]]

    def delete(self, cluster: Cluster) -> None:
        for kind, name, namespace in self.elsewhere:
            where = ("-n", namespace) if namespace else ()
            cluster.kubectl(*where, "delete", kind, name, "--ignore-not-found", check=False)


def chart_identity(cluster: Cluster, namespace: str, out: Path,
                   values: tuple[str, ...] = ()) -> ChartIdentity:
    """The chart's RBAC for an operator watching `namespace`, applied; a kubeconfig for it.
    `values`: more `--set` values (e.g. kueue.enabled=true)."""
    rendered = subprocess.run(
        [str(BIN / "helm"), "template", "mwo", str(CHART), "-n", namespace,
         "--set", f"watchNamespaces={{{namespace}}}",
         *(arg for value in values for arg in ("--set", value))],
        check=True, capture_output=True, text=True, timeout=60).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] in RBAC_KINDS]
    for where in {o["metadata"].get("namespace", namespace) for o in objects}:
        cluster.kubectl("-n", where, "apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [
                o for o in objects if o["metadata"].get("namespace", namespace) == where]}))
    account = next(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    token = cluster.kubectl("-n", namespace, "create", "token", account,
                            "--duration=4h").stdout.strip()
    admin: Any = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "chart",
        "clusters": [{"name": "c", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "chart", "context": {"cluster": "c", "user": account,
                                                    "namespace": namespace}}],
    }
    path = out / "chart-rbac.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    elsewhere = [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""))
                 for o in objects if o["kind"].startswith("Cluster")
                 or o["metadata"].get("namespace", namespace) != namespace]
    return ChartIdentity(path, elsewhere)
