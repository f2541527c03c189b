"""What a new user sees first: the scripts `make run` calls say little, and only what matters."""

from __future__ import annotations

import subprocess

import yaml

from tests.cluster import REPO, Cluster

WAIT_CRD = REPO / "hack" / "cluster" / "wait-crd.sh"


def test_waiting_for_a_just_applied_crd_prints_nothing_and_a_timeout_says_one_line(
    cluster: Cluster,
) -> None:
    """`make run` waits for the 650 KB MultiWorkerJob CRD right after applying it; while it has
    no conditions yet, a jsonpath query fails and kubectl prints the whole object (400 KB on a
    new user's screen). The wait prints nothing; a timeout prints one line."""
    crd = yaml.safe_load((REPO / "crds" / "multiworker.dev_multiworkerjobs.yaml").read_text())
    group = "quiet.multiworker.dev"  # the same big schema under another name
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    crd["spec"]["group"] = group
    name = crd["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(crd))
    try:
        waited = subprocess.run([str(WAIT_CRD), name, "60"], env=cluster.env,
                                capture_output=True, text=True, timeout=90, check=False)
        assert waited.returncode == 0, waited.stderr[:500]
        assert waited.stdout + waited.stderr == ""
    finally:
        cluster.kubectl("delete", "crd", name, "--wait=false", check=False)
    missing = subprocess.run([str(WAIT_CRD), f"absent.{group}", "1"], env=cluster.env,
                             capture_output=True, text=True, timeout=30, check=False)
    assert missing.returncode == 1
    assert missing.stdout == "" and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith(f"wait-crd.sh: absent.{group} is not Established after 1s")
    assert len(missing.stderr) < 500
