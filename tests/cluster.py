"""Which Kubernetes cluster the integration and e2e tiers run against, and how to reach it.

`CLUSTER=local` (default) brings up the built-in real cluster (hack/cluster/up.sh, one node),
`CLUSTER=kind` the kind cluster (hack/kind/up.sh: a control plane and two workers; it starts
a private Docker engine when none answers), `CLUSTER=existing` uses `$KUBECONFIG`.
Only cluster creation and image loading differ between them; every test is shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MW_CACHE", Path.home() / ".cache" / "multiworker"))
BIN = CACHE / "bin"
KIND_CLUSTER_NAME = "multiworker"
KIND_ENV = REPO / ".cluster" / "kind.env"
# Where hostPath volumes are visible to every node: the local cluster has one node, kind
# mounts one host directory into all of them (hack/kind/up.sh); elsewhere nothing is shared.
LOCAL_SHARED_DIR = "/var/lib/multiworker"


@dataclass
class Cluster:
    kind: str
    kubeconfig: Path
    env: dict[str, str] = field(default_factory=dict)
    shared_dir: str | None = None  # a node path every node sees the same files under

    @classmethod
    def for_kind(
        cls, kind: str, kubeconfig: Path, extra_env: dict[str, str] | None = None,
        shared_dir: str | None = None,
    ) -> Cluster:
        env = dict(os.environ)
        env.update(extra_env or {})
        env["KUBECONFIG"] = str(kubeconfig)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        return cls(kind=kind, kubeconfig=kubeconfig, env=env, shared_dir=shared_dir)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure the error names the command and stderr."""
        return self._run([self.kubectl_path(), *args], input=input, check=check, timeout=timeout)

    def docker(self, *args: str, check: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run docker against the engine that holds the kind nodes (kind clusters only)."""
        assert self.kind == "kind", f"docker {' '.join(args)}: the {self.kind} cluster has no nodes in Docker"
        return self._run(["docker", *args], check=check, timeout=timeout)

    def _run(self, cmd: list[str], input: str | None = None, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, env=self.env, timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{Path(cmd[0]).name} {' '.join(cmd[1:])} exited {proc.returncode}:\n"
                f"{proc.stderr}{proc.stdout}"
            )
        return proc

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Poll until every CRD is Established: `kubectl wait` fails outright while a CRD just
        created has no conditions yet (seen in CI), instead of waiting for them.
        """
        query = "{.status.conditions[?(@.type=='Established')].status}"
        for crd in crds:
            name = crd.removeprefix("crd/")

            def established(name: str = name) -> bool:
                proc = self.kubectl("get", "crd", name, "-o", f"jsonpath={query}", check=False)
                return proc.stdout == "True"

            wait_for(established, timeout, describe=f"CRD {name} to be Established")

    def kubectl_path(self) -> str:
        return shutil.which("kubectl", path=self.env["PATH"]) or "kubectl"

    def remove_shared(self, path: str) -> None:
        """Remove `path`, under shared_dir, once its test is done with it: hostPath volumes have
        no deleter outside /tmp, so whatever their reclaim policy their files stay behind (this
        machine's folder; kind's nodes mount it at the same path)."""
        if self.shared_dir:
            shutil.rmtree(f"{self.shared_dir}/{path}", ignore_errors=True)

    def api_client(self):  # type: ignore[no-untyped-def]
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        return items

    def schedulable_workers(self) -> list[str]:
        """Names of the nodes ordinary pods may land on (no NoSchedule taint, not cordoned)."""
        def schedulable(node: dict[str, Any]) -> bool:
            spec = node.get("spec", {})
            taints = [t for t in spec.get("taints", []) if t.get("effect") == "NoSchedule"]
            return not spec.get("unschedulable") and not taints
        return sorted(n["metadata"]["name"] for n in self.nodes() if schedulable(n))


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (optionally `export`ed, '#' comments), as hack/kind/up.sh writes them."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip().removeprefix("export ").strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def run_script(*args: str, env: dict[str, str] | None = None) -> None:
    """Run a repo script, streaming its output (bring-up logs help when CI goes red)."""
    subprocess.run([str(REPO / args[0]), *args[1:]], check=True, cwd=REPO, env=env)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created as needed) for the block: it holds across
    processes, pytest-xdist workers included, and goes with the file's closing."""
    path.parent.mkdir(exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def one_setup_at_a_time(kind: str) -> contextlib.AbstractContextManager[None]:
    """Bring a cluster up, or load images into it, one test session at a time: `make test` runs
    pytest-xdist workers, each with its own session fixtures, and the scripts behind them are
    idempotent but not safe to run twice at once (up.sh tears down a cluster it finds half up).
    The first worker does the work; the others then find it done in seconds."""
    return file_lock(REPO / ".cluster" / f"test-setup-{kind}.lock")


def provision(kind: str) -> Cluster:
    """Return a reachable cluster of the requested kind, creating it when needed."""
    with one_setup_at_a_time(kind):
        return _provision(kind)


def _provision(kind: str) -> Cluster:
    if kind == "local":
        run_script("hack/cluster/up.sh")  # idempotent: seconds when already up
        return Cluster.for_kind("local", REPO / ".cluster" / "kubeconfig",
                                shared_dir=LOCAL_SHARED_DIR)
    if kind == "kind":
        run_script("hack/kind/up.sh")  # idempotent: seconds when already up
        env = read_env_file(KIND_ENV)
        return Cluster.for_kind("kind", Path(env["KUBECONFIG"]), extra_env=env,
                                shared_dir=env["MW_KIND_SHARED_DIR"])
    if kind == "existing":
        path = os.environ.get("KUBECONFIG")
        if not path:
            raise RuntimeError("CLUSTER=existing needs KUBECONFIG to point at the cluster")
        return Cluster.for_kind("existing", Path(path))
    raise RuntimeError(f"CLUSTER must be local, kind or existing, not {kind!r}")


def load_images(cluster: Cluster, names: list[str]) -> None:
    """Build (cached by content) and load the project's images into the cluster."""
    if cluster.kind == "existing":
        return  # the user's cluster pulls from wherever its images were pushed
    with one_setup_at_a_time(cluster.kind):
        run_script("hack/images/build.sh", *names)
        if cluster.kind == "kind":
            run_script("hack/images/load.sh", "--kind", KIND_CLUSTER_NAME, *names,
                       env=cluster.env)
        else:
            run_script("hack/images/load.sh", *names)
