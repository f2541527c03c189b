"""Which Kubernetes cluster the integration and e2e tiers run against, and how to reach it.

`CLUSTER=local` (default) brings up the built-in real cluster (hack/cluster/up.sh),
`CLUSTER=kind` creates a kind cluster (needs Docker), `CLUSTER=existing` uses `$KUBECONFIG`.
Only cluster creation and image loading differ between them; every test is shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MW_CACHE", Path.home() / ".cache" / "multiworker"))
BIN = CACHE / "bin"
KIND_CLUSTER_NAME = "multiworker"


@dataclass
class Cluster:
    kind: str
    kubeconfig: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_kind(cls, kind: str, kubeconfig: Path) -> Cluster:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        return cls(kind=kind, kubeconfig=kubeconfig, env=env)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure the error names the command and stderr."""
        cmd = [self.kubectl_path(), *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, env=self.env, timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
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

    def api_client(self):  # type: ignore[no-untyped-def]
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


def run_script(*args: str) -> None:
    """Run a repo script, streaming its output (bring-up logs help when CI goes red)."""
    subprocess.run([str(REPO / args[0]), *args[1:]], check=True, cwd=REPO)


def provision(kind: str) -> Cluster:
    """Return a reachable cluster of the requested kind, creating it when needed."""
    if kind == "local":
        run_script("hack/cluster/up.sh")  # idempotent: seconds when already up
        return Cluster.for_kind("local", REPO / ".cluster" / "kubeconfig")
    if kind == "kind":
        run_script("hack/kind/up.sh")
        return Cluster.for_kind("kind", REPO / ".cluster" / "kind-kubeconfig")
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
    run_script("hack/images/build.sh", *names)
    if cluster.kind == "kind":
        run_script("hack/images/load.sh", "--kind", KIND_CLUSTER_NAME, *names)
    else:
        run_script("hack/images/load.sh", *names)
