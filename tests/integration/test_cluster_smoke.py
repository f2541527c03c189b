"""Proof that the cluster under test is a real Kubernetes: every check here needs a real
API server, scheduler, kubelet, container runtime, kube-proxy and cluster DNS to pass."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.cluster import Cluster
from tests.support import USES_NODE_GPUS, wait_for

BASE = "multiworker.local/base:bookworm"

pytestmark = pytest.mark.usefixtures("images")


def pod(name: str, script: str, **spec: object) -> dict[str, object]:
    """A one-shot pod running a Python script from the base image."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BASE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", textwrap.dedent(script)],
                }
            ],
            **spec,
        },
    }


def apply(cluster: Cluster, namespace: str, *objects: dict[str, object]) -> None:
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    cluster.kubectl("-n", namespace, "apply", "--validate=strict", "-f", "-", input=doc)


def pod_phase(cluster: Cluster, namespace: str, name: str) -> str:
    proc = cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.phase}")
    return proc.stdout


def wait_phase(cluster: Cluster, namespace: str, name: str, phase: str, timeout: float = 90) -> None:
    def describe() -> str:
        out = cluster.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout
        logs = cluster.kubectl("-n", namespace, "logs", name, check=False)
        return f"pod {name} to be {phase}\n{out}\n{logs.stdout}{logs.stderr}"

    wait_for(lambda: pod_phase(cluster, namespace, name) == phase, timeout, describe=describe)


def test_strict_client_validation_accepts_and_rejects(cluster: Cluster, namespace: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok"}, "data": {"a": "b"}}
    apply(cluster, namespace, cm)
    bad = {**cm, "metadata": {"name": "bad"}, "dataa": {"a": "b"}}
    proc = cluster.kubectl(
        "-n", namespace, "apply", "--validate=strict", "-f", "-",
        input=json.dumps(bad), check=False,
    )
    assert proc.returncode != 0
    assert "dataa" in proc.stderr


CEL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.multiworker.dev"},
    "spec": {
        "group": "smoke.multiworker.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                    "x-kubernetes-validations": [
                        {"rule": "self.min <= self.max", "message": "min must not exceed max"}
                    ],
                }},
            }},
        }],
    },
}


def test_crd_cel_rule_rejects_bad_object(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(CEL_CRD))
    cluster.wait_established("widgets.smoke.multiworker.dev", timeout=30)

    def widget(name: str, lo: int, hi: int) -> str:
        return json.dumps({
            "apiVersion": "smoke.multiworker.dev/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"min": lo, "max": hi},
        })

    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=widget("good", 1, 2))
    proc = cluster.kubectl(
        "-n", namespace, "apply", "-f", "-", input=widget("bad", 3, 2), check=False
    )
    assert proc.returncode != 0
    assert "min must not exceed max" in proc.stderr


# hack/cluster/configs.sh and hack/kind/up.sh: a limit managed clusters use, so that a leak of
# threads fails the tests instead of a long run.
POD_PIDS_LIMIT = 4096


def test_the_kubelet_caps_a_pods_threads(cluster: Cluster, namespace: str) -> None:
    """A pod that starts threads until it cannot is stopped near the kubelet's podPidsLimit:
    a trainer whose threads grow with its collectives dies here in minutes, as on a managed
    cluster, rather than after hours."""
    script = """
        import threading
        hold = threading.Event()
        count = 0
        try:
            while count < 20000:
                threading.Thread(target=hold.wait, daemon=True).start()
                count += 1
        except RuntimeError:
            pass
        print("threads", count, flush=True)
        hold.set()
    """
    apply(cluster, namespace, pod("pids", script))
    wait_phase(cluster, namespace, "pids", "Succeeded", timeout=120)
    out = cluster.kubectl("-n", namespace, "logs", "pids").stdout
    started = int(out.split()[-1])
    assert POD_PIDS_LIMIT - 50 < started < POD_PIDS_LIMIT, out


def test_deployment_pod_runs_on_real_kubelet(cluster: Cluster, namespace: str) -> None:
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sleeper"},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "sleeper"}},
            "template": {
                "metadata": {"labels": {"app": "sleeper"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                    "name": "main", "image": BASE, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                }]},
            },
        },
    }
    apply(cluster, namespace, deploy)
    cluster.kubectl(
        "-n", namespace, "rollout", "status", "deployment/sleeper", "--timeout=90s", timeout=100
    )
    # The container really runs: exec into it through the kubelet.
    out = cluster.kubectl("-n", namespace, "exec", "deploy/sleeper", "--", "cat", "/etc/os-release")
    assert "bookworm" in out.stdout


def test_pod_resolves_and_connects_to_peer_by_headless_dns(
    cluster: Cluster, namespace: str
) -> None:
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"},
        "spec": {
            "clusterIP": "None", "publishNotReadyAddresses": True,
            "selector": {"group": "peers"}, "ports": [{"name": "http", "port": 8080}],
        },
    }
    server = pod(
        "server", "import http.server as h; h.HTTPServer(('', 8080), h.SimpleHTTPRequestHandler)"
        ".serve_forever()", hostname="server", subdomain="peers",
    )
    server["metadata"]["labels"]["group"] = "peers"  # type: ignore[index]
    peer = f"server.peers.{namespace}.svc"
    client = pod("client", f"""
        import socket, time, urllib.request
        for _ in range(120):
            try:
                print("resolved", socket.gethostbyname("{peer}")); break
            except OSError:
                time.sleep(0.5)
        for _ in range(60):
            try:
                print(urllib.request.urlopen("http://{peer}:8080/", timeout=2).status); break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("could not connect")
    """)
    apply(cluster, namespace, service, server, client)
    wait_phase(cluster, namespace, "client", "Succeeded", timeout=120)
    logs = cluster.kubectl("-n", namespace, "logs", "client").stdout
    server_ip = cluster.kubectl("-n", namespace, "get", "pod", "server", "-o",
                                "jsonpath={.status.podIP}").stdout
    assert f"resolved {server_ip}\n" in logs and "200" in logs


def test_pod_reaches_api_through_kubernetes_clusterip(cluster: Cluster, namespace: str) -> None:
    reader = pod("api-reader", """
        import json, ssl, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
        req = urllib.request.Request("https://kubernetes.default.svc/version",
            headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
        print("version", json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
    """)
    apply(cluster, namespace, reader)
    wait_phase(cluster, namespace, "api-reader", "Succeeded")
    assert "version v1." in cluster.kubectl("-n", namespace, "logs", "api-reader").stdout


def gpu_pod(name: str, gpus: int) -> dict[str, object]:
    p = pod(name, "import time; time.sleep(3600)")
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}  # type: ignore[index]
    return p


@USES_NODE_GPUS
def test_gpu_requests_are_scheduled_against_advertised_capacity(
    cluster: Cluster, namespace: str
) -> None:
    capacity = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    most = max(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in capacity)
    assert most >= 1, "no node advertises nvidia.com/gpu"
    apply(cluster, namespace, gpu_pod("one-gpu", 1), gpu_pod("too-many-gpus", most + 1))
    wait_phase(cluster, namespace, "one-gpu", "Running")

    def unschedulable_message() -> str:
        out = cluster.kubectl(
            "-n", namespace, "get", "pod", "too-many-gpus", "-o",
            "jsonpath={.status.conditions[?(@.type=='PodScheduled')].message}",
        ).stdout
        return out if "Insufficient nvidia.com/gpu" in out else ""

    wait_for(unschedulable_message, 60, describe="'Insufficient nvidia.com/gpu' on too-many-gpus")
    assert pod_phase(cluster, namespace, "too-many-gpus") == "Pending"


def test_deleting_owner_garbage_collects_children(cluster: Cluster, namespace: str) -> None:
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    apply(cluster, namespace, owner)
    uid = cluster.kubectl(
        "-n", namespace, "get", "configmap", "owner", "-o", "jsonpath={.metadata.uid}"
    ).stdout
    child = pod("child", "import time; time.sleep(3600)")
    child["metadata"]["ownerReferences"] = [{  # type: ignore[index]
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
    }]
    apply(cluster, namespace, child)
    wait_phase(cluster, namespace, "child", "Running")
    cluster.kubectl("-n", namespace, "delete", "configmap", "owner")

    def child_gone() -> bool:
        proc = cluster.kubectl("-n", namespace, "get", "pod", "child", check=False)
        return proc.returncode != 0 and "NotFound" in proc.stderr

    wait_for(child_gone, 90, describe="the garbage collector to delete pod child")
