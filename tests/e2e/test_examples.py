"""The example CPU job runs to success through the Helm-installed operator: the path a user
takes (`helm install`, `kubectl apply -f examples/cpu-job.yaml`), on whichever cluster the suite
runs against. The operator runs in a pod here, so it also reaches the workers' progress
endpoints over the pod network rather than from the host."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.cluster import REPO
from tests.integration.jobs import Jobs
from tests.integration.test_helm import Release

pytestmark = pytest.mark.usefixtures("worker_image", "chart_crds")


def test_cpu_example_succeeds_through_the_helm_installed_operator(
    release: Release, jobs: Jobs, checkpoint_claim: str, tmp_path: Path
) -> None:
    release.install({"watchNamespaces": [release.namespace]}, tmp_path)
    release.wait_rolled_out()
    example = yaml.safe_load((REPO / "examples" / "cpu-job.yaml").read_text())
    assert example["spec"]["checkpoint"]["claimName"] == checkpoint_claim
    name = example["metadata"]["name"]
    jobs.apply(example)
    status = jobs.wait_phase(name, "Succeeded", timeout=300)
    assert status["restarts"] == 0 and status["disruptions"] == 0, status
    assert (status.get("progress") or {}).get("step", 0) > 0, status
    assert any(reason == "ChiefSucceeded" for _, reason, _ in jobs.events(name))
