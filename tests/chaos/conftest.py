"""The chaos tier: the real operator process against the real cluster while things break.

Its size and seed come from the environment (config.py): `make test` runs the bounded form,
`make chaos` the full one. Every case records its figures with the `figures` fixture; they
are printed at the end of the run, under "measured" (and appended to
test-logs/chaos-figures.txt).

The control-plane cases stop the shared cluster's API server and etcd, and others time what
they measure: those run alone (tests.support.alone), never beside other cluster tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.config import Chaos, from_env
from tests.chaos.control import ControlPlane
from tests.chaos.recorder import Recorder
from tests.cluster import REPO, Cluster
from tests.integration.conftest import (  # noqa: F401 (fixtures shared with integration)
    chart_env,
    crds,
    jobs,
    operator,
)

FIGURES_FILE = REPO / "test-logs" / "chaos-figures.txt"


@pytest.fixture(scope="session")
def chaos() -> Chaos:
    return from_env()


class Figures:
    """What one case measured, one line per figure: in the test's report, so pytest's summary
    lists them whichever pytest-xdist worker ran the case (tests/conftest.py, "measured"), and
    appended to test-logs/chaos-figures.txt with the settings the case ran with."""

    def __init__(self, item: pytest.Item, settings: Chaos) -> None:
        self.item, self.settings = item, settings

    def __call__(self, text: str) -> None:
        self.item.user_properties.append(("figure: chaos", text))
        print(f"[{self.item.name}] {text}")
        FIGURES_FILE.parent.mkdir(parents=True, exist_ok=True)
        with FIGURES_FILE.open("a") as out:
            out.write(f"{self.item.name} ({self.settings.describe()}): {text}\n")


@pytest.fixture
def figures(request: pytest.FixtureRequest, chaos: Chaos) -> Figures:
    return Figures(request.node, chaos)


@pytest.fixture(scope="session")
def control(cluster: Cluster) -> ControlPlane:
    if cluster.kind != "local":
        pytest.skip("stopping the control plane needs the local cluster (CLUSTER=local)")
    return ControlPlane()


@pytest.fixture(autouse=True)
def alone(request: pytest.FixtureRequest) -> None:
    """No other operator instance may handle the case's namespace (a cluster-wide Helm release
    left behind, say): it would take the test operator's Leases, so the case would measure it
    instead of the operator it starts and kills. The tests' own releases each handle only their
    own namespace."""
    if "operator" not in request.fixturenames:
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    namespace: str = request.getfixturevalue("namespace")
    found = cluster.kubectl("get", "pods", "-A", "-l", "app.kubernetes.io/name=multiworker-operator",
                            "--field-selector=status.phase=Running", "-o", "json")
    others = [f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
              for pod in json.loads(found.stdout)["items"] if handles(pod, namespace)]
    if others:
        pytest.fail("another operator instance handles this namespace and would compete for the "
                    "test operator's Leases: " + "; ".join(others) + " (helm uninstall it)")


def handles(pod: dict[str, Any], namespace: str) -> bool:
    """Whether an operator pod handles jobs in `namespace` (the chart passes --all-namespaces
    or one --namespace=NS per watched namespace; any other form counts as handling it)."""
    args = [arg for c in pod["spec"]["containers"] for arg in c.get("args") or []]
    listed = {arg.split("=", 1)[1] for arg in args if arg.startswith("--namespace=")}
    return "--all-namespaces" in args or not listed or namespace in listed


@pytest.fixture
def recorder(cluster: Cluster, namespace: str) -> Iterator[Recorder]:
    """The test's own watch of its namespace's pods and jobs, from before anything happens."""
    found = Recorder(cluster.api_client(), namespace).start()
    yield found
    found.stop()


def operator_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def shared_dir(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A host directory the honest job's workers share (the heartbeat of the pacemaker), on
    every node: the honest job's workers may land on different ones (kind)."""
    if cluster.shared_dir is None:
        pytest.skip("no directory shared by every node is known for the honest job's heartbeat")
    yield f"{cluster.shared_dir}/chaos-{namespace}"
    cluster.remove_shared(f"chaos-{namespace}")
