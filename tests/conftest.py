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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import (
    REPO,
    Cluster,
    file_lock,
    load_images,
    one_setup_at_a_time,
    provision,
)
from tests.failures import explain
from tests.support import has_failed

LOG_DIR = REPO / "test-logs"
TEST_NAMESPACE_PREFIX = "t-"  # every namespace the `namespace` fixture makes
KWOK_SCRIPT = REPO / "hack/cluster/fake-nodes.sh"


# Fake nodes carry a NoSchedule taint that only their tests' pods tolerate, and a GPU product on
# nodes a job cannot use is no candidate for it (creation.usable_nodes), so their tests share the
# cluster with the others. Each kind is used by one test at a time: kwok's (`fake_nodes`,
# hack/cluster/fake-nodes.sh) are the same two nodes for every test, and a test's own
# (`fake_node`, integration/fake_nodes.py) going silent while another test's does would look
# like most nodes going at once (the control plane).
# Fixtures that wait for a binary .ci/run builds in the background while the tests run.
BUILT_BESIDE = {"gang_scheduler", "kueue", "prometheus", "promtool"}
KWOK_NODES = "fake_nodes"
OWN_FAKE_NODES = "fake_node"
USES_KWOK_NODES = pytest.mark.shares("kwok-nodes")
USES_FAKE_NODES = pytest.mark.shares("fake-nodes")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone(reason): runs with no other test on the cluster; `make test` runs "
        "these first, one at a time, then the others in parallel (tests.support.alone)")
    config.addinivalue_line(
        "markers", "shares(resource): holds the resource's lock while it runs, so tests that "
        "share it run one at a time whatever pytest-xdist worker runs them")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if KWOK_NODES in fixtures:
            item.add_marker(USES_KWOK_NODES)
        if OWN_FAKE_NODES in fixtures:
            item.add_marker(USES_FAKE_NODES)
        if "launcher" in fixtures:
            # TensorFlow groups on loopback (runtime tier) bound how long an abort takes on two
            # busy cores: one group at a time.
            item.add_marker(pytest.mark.shares("tf-loopback"))
        for mark in item.iter_markers("shares"):
            # Also one pytest-xdist worker for all of them (`--dist loadgroup`): tests that
            # wait for one lock in several workers would leave those workers idle.
            item.add_marker(pytest.mark.xdist_group(str(mark.args[0])))
    # Those chains first: each is one worker's serial work, the longest of the run, so it
    # must not start last (xdist hands work out in this order). The tests that need a binary
    # .ci/run builds beside the tests (the coscheduler, Kueue, Prometheus) last, within the
    # chains and without: a worker that takes one early only waits for its build.
    items.sort(key=lambda item: (item.get_closest_marker("shares") is None,
                                 bool(BUILT_BESIDE & set(getattr(item, "fixturenames", ())))))


@pytest.fixture(autouse=True)
def shared(request: pytest.FixtureRequest) -> Iterator[None]:
    """The locks of what the test shares (`shares` marks), held from before its other
    function fixtures to after them: a file lock, so it holds whichever pytest-xdist worker
    runs the test, however pytest is called (xdist_group only schedules, and only with
    `--dist loadgroup`)."""
    names = sorted({str(m.args[0]) for m in request.node.iter_markers("shares")})
    cluster = os.environ.get("CLUSTER", "local")
    with ExitStack() as held:
        for name in names:
            held.enter_context(file_lock(REPO / ".cluster" / f"test-{name}-{cluster}.lock"))
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Figures tests measured (`record_property("figure: ...", value)`), after the results.
    Here, not in a tier's conftest: pytest-xdist's controller loads only this one."""
    figures = [(report.nodeid.rsplit("::", 1)[-1], key, value)
               for reports in terminalreporter.stats.values() for report in reports
               if getattr(report, "when", "") == "call"
               for key, value in getattr(report, "user_properties", [])
               if key.startswith("figure: ")]
    if figures:
        terminalreporter.section("measured")
        for test, key, value in figures:
            terminalreporter.write_line(f"{key.removeprefix('figure: ')}: {value}  ({test})")
    workers = worker_timelines(terminalreporter)
    if len(workers) > 1:
        terminalreporter.section("pytest-xdist workers")
        for line in workers:
            terminalreporter.write_line(line)


def worker_timelines(terminalreporter: pytest.TerminalReporter) -> list[str]:
    """Each worker's tests, busy time and when it ran out of work, from the run's start: the
    worker that finishes last is the run's critical path, and its last tests say why."""
    phases = [report for reports in terminalreporter.stats.values() for report in reports
              if isinstance(report, pytest.TestReport) and getattr(report, "start", 0)]
    if not phases:
        return []
    began = min(report.start for report in phases)
    by_worker: dict[str, list[pytest.TestReport]] = {}
    for report in phases:
        node = getattr(report, "node", None)
        by_worker.setdefault(getattr(getattr(node, "gateway", None), "id", "main"),
                             []).append(report)
    lines = []
    for worker, reports in sorted(by_worker.items(), key=lambda kv: max(r.stop for r in kv[1])):
        last = max(reports, key=lambda r: r.stop)
        tests = len({r.nodeid for r in reports})
        busy = sum(r.stop - r.start for r in reports)
        lines.append(f"{worker}: {tests} tests, busy {busy:.0f} s, done at +{last.stop - began:.0f} s"
                     f" (its last: {last.nodeid})")
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember each phase's outcome on the item so fixtures can save logs for failed tests;
    a failed test with a namespace shows that namespace's story in its own report (what its
    jobs, pods and operator said at the failure, before teardown deletes them)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    found = getattr(item, "funcargs", {})
    if report.failed and report.when in ("setup", "call") and "namespace" in found \
            and isinstance(found.get("cluster"), Cluster):
        operator = found.get("operator")
        report.sections.append(("the cluster at the failure (tests/failures.py)", explain(
            found["cluster"], found["namespace"],
            operator if hasattr(operator, "log_tail") else None)))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster under test, with any installed operator (say, the release `make run`
    installed) scaled to zero while test sessions run and scaled back after the last one: its
    leader election would otherwise take the tests' namespaces from the tests' own operators."""
    found = provision(os.environ.get("CLUSTER", "local"))
    with one_setup_at_a_time(found.kind):
        join_sessions(found)
    yield found
    with one_setup_at_a_time(found.kind):
        leave_sessions(found)


def live_sessions(cluster: Cluster) -> tuple[Path, dict[str, Any]]:
    """Where the test sessions on `cluster` are counted, and what it says, less the sessions
    whose process is gone (a run killed mid-way)."""
    path = REPO / ".cluster" / f"test-sessions-{cluster.kind}.json"
    state = json.loads(path.read_text()) if path.exists() else {"pids": [], "paused": []}
    state["pids"] = [pid for pid in state["pids"] if Path(f"/proc/{pid}").exists()]
    return path, state


def join_sessions(cluster: Cluster) -> None:
    """Count this test session in (pytest-xdist runs one per worker); the first pauses the
    installed operators and notes them for the last."""
    path, state = live_sessions(cluster)
    if not state["pids"]:
        state["paused"] += pause_installed_operators(cluster)
    state["pids"].append(os.getpid())
    path.write_text(json.dumps(state))


def leave_sessions(cluster: Cluster) -> None:
    path, state = live_sessions(cluster)
    state["pids"] = [pid for pid in state["pids"] if pid != os.getpid()]
    if not state["pids"]:
        for namespace, name, replicas in state["paused"]:
            cluster.kubectl("-n", namespace, "scale", "deployment", name,
                            f"--replicas={replicas}", check=False)
        state["paused"] = []
        if state.pop("kwok", False):
            subprocess.run([str(KWOK_SCRIPT), "--delete"], check=False,
                           env={**os.environ, **cluster.env}, timeout=300)
    path.write_text(json.dumps(state))


def pause_installed_operators(cluster: Cluster) -> list[tuple[str, str, int]]:
    proc = cluster.kubectl("get", "deployments", "-A", "-l",
                           "app.kubernetes.io/name=multiworker-operator", "-o", "json",
                           check=False)
    if proc.returncode != 0:
        return []
    paused = []
    for item in json.loads(proc.stdout).get("items", []):
        meta, replicas = item["metadata"], item["spec"].get("replicas", 1)
        if meta["namespace"].startswith(TEST_NAMESPACE_PREFIX):
            continue  # a release of a test still running in another worker
        if replicas:
            print(f"pausing {meta['namespace']}/{meta['name']} for the test session "
                  "(scaled back afterwards)")
            cluster.kubectl("-n", meta["namespace"], "scale", "deployment", meta["name"],
                            "--replicas=0")
            paused.append((meta["namespace"], meta["name"], int(replicas)))
    return paused


@pytest.fixture(scope="session")
def fake_nodes(cluster: Cluster) -> Iterator[list[str]]:
    """Two kwok fake nodes for pods that need not run, tainted (hack/cluster/fake-nodes.sh);
    deleted when the last test session on the cluster ends, which another pytest-xdist
    worker's may be."""
    if cluster.kind != "local":
        pytest.skip("kwok fake nodes are set up on the local cluster only")
    subprocess.run([str(KWOK_SCRIPT), "2", "8"], check=True, env={**os.environ, **cluster.env},
                   timeout=300)
    yield ["fake-0", "fake-1"]
    with one_setup_at_a_time(cluster.kind):
        path, state = live_sessions(cluster)
        state["kwok"] = True  # leave_sessions deletes them
        path.write_text(json.dumps(state))


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
    name = f"{TEST_NAMESPACE_PREFIX}{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    if has_failed(request):
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
