"""Make targets that act on a cluster act on the one CLUSTER names, or refuse before any work."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.cluster import REPO


def make(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)


def test_images_load_loads_the_kind_cluster_when_cluster_is_kind() -> None:
    planned = make("-n", "images-load", "CLUSTER=kind").stdout
    assert "hack/images/load.sh --kind multiworker base worker operator" in planned


def test_images_load_refuses_an_unknown_cluster_before_building() -> None:
    done = make("images-load", "CLUSTER=bogus")
    assert done.returncode != 0
    assert "images-load: CLUSTER must be local or kind, not 'bogus'" in done.stderr
    assert "[images]" not in done.stdout + done.stderr  # nothing was built
