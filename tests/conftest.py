"""Fixtures shared by the integration and e2e tiers: the cluster, images and a namespace per test.

Unit and runtime tests never touch these, so they run without any cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import REPO, Cluster, load_images, provision

LOG_DIR = REPO / "test-logs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember each phase's outcome on the item so fixtures can save logs for failed tests."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster under test, with any installed operator (say, the release `make run`
    installed) scaled to zero for the session and scaled back afterwards: its leader
    election would otherwise take the tests' namespaces from the tests' own operators."""
    found = provision(os.environ.get("CLUSTER", "local"))
    paused = pause_installed_operators(found)
    yield found
    for namespace, name, replicas in paused:
        found.kubectl("-n", namespace, "scale", "deployment", name, f"--replicas={replicas}",
                      check=False)


def pause_installed_operators(cluster: Cluster) -> list[tuple[str, str, int]]:
    proc = cluster.kubectl("get", "deployments", "-A", "-l",
                           "app.kubernetes.io/name=multiworker-operator", "-o", "json",
                           check=False)
    if proc.returncode != 0:
        return []
    paused = []
    for item in json.loads(proc.stdout).get("items", []):
        meta, replicas = item["metadata"], item["spec"].get("replicas", 1)
        if replicas:
            print(f"pausing {meta['namespace']}/{meta['name']} for the test session "
                  "(scaled back afterwards)")
            cluster.kubectl("-n", meta["namespace"], "scale", "deployment", meta["name"],
                            "--replicas=0")
            paused.append((meta["namespace"], meta["name"], int(replicas)))
    return paused


@pytest.fixture(scope="session")
def fake_nodes(cluster: Cluster) -> Iterator[list[str]]:
    """Two kwok fake nodes for pods that need not run (deleted at the end of the session)."""
    if cluster.kind != "local":
        pytest.skip("kwok fake nodes are set up on the local cluster only")
    script = str(REPO / "hack/cluster/fake-nodes.sh")
    env = {**os.environ, **cluster.env}
    subprocess.run([script, "2", "8"], check=True, env=env, timeout=300)
    yield ["fake-0", "fake-1"]
    subprocess.run([script, "--delete"], check=False, env=env, timeout=300)


@pytest.fixture(scope="session")
def images(cluster: Cluster) -> list[str]:
    """The small images integration tests run (base: sh, sleep, python3)."""
    names = ["base"]
    load_images(cluster, names)
    return names


@pytest.fixture(scope="session")
def worker_image(cluster: Cluster) -> str:
    """The TensorFlow worker image e2e tests run."""
    load_images(cluster, ["worker"])
    return "multiworker.local/worker:dev"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test; on failure its objects, events and pod logs go to test-logs/."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    failed = any(
        getattr(getattr(request.node, f"rep_{w}", None), "failed", False)
        for w in ("setup", "call")
    )
    if failed:
        save_namespace_logs(cluster, name, LOG_DIR / name)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def save_namespace_logs(cluster: Cluster, namespace: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dumps = {
        "objects.txt": ["get", "all,multiworkerjobs,events", "-o", "wide"],
        "describe.txt": ["describe", "pods,multiworkerjobs"],
        "objects.yaml": ["get", "pods,services,multiworkerjobs", "-o", "yaml"],
    }
    for filename, args in dumps.items():
        proc = cluster.kubectl("-n", namespace, *args, check=False)
        (out / filename).write_text(proc.stdout + proc.stderr)
    pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "name", check=False).stdout.split()
    for pod in pods:
        proc = cluster.kubectl("-n", namespace, "logs", pod, "--all-containers", check=False)
        (out / f"{pod.replace('/', '-')}.log").write_text(proc.stdout + proc.stderr)
