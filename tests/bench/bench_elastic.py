"""spec.elastic on the local real cluster: how long a group short of GPUs takes to train on
smaller, and a shrunk one to train at full size again once the GPUs are back (real TensorFlow
pods; not part of CI).

    .venv/bin/python tests/bench/bench_elastic.py [--rounds 3] [--wait 10]

Needs the local cluster (make cluster-up) with the worker image loaded (make images-load):
its node advertises 4 nvidia.com/gpu. Runs the real operator (on this host) for a fresh
namespace with a hostPath checkpoint claim. Per round: a pod of no job holds 2 of the node's
GPUs; the CPU example (examples/cpu-job.yaml, digits) is applied as 3 workers of one GPU
each, `elastic: {minWorkers: 2, shrinkAfterSeconds: W, growAfterSeconds: W}`:

- short: from the apply until a worker of the 2-worker generation reports a training step;
- back: from the hog's deletion until a worker of the grown 3-worker generation reports a
  training step past the one it restored.

Both include the configured wait W; the table shows them with W taken off too (what the
operator and the new collective cost on top of the wait the user chose).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_in_place import claim, pods, progress, status
from tests.bench.harness import REPO, Cluster, Obj, operator

GPU = "nvidia.com/gpu"
GENERATION = "multiworker.dev/group-generation"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wait", type=int, default=10,
                        help="shrinkAfterSeconds and growAfterSeconds")
    parser.add_argument("--timeout", type=float, default=600)
    return parser.parse_args()


def gpu_node(cluster: Cluster) -> str:
    nodes: Any = cluster.core.list_node()
    for node in nodes.items:
        if (node.status.allocatable or {}).get(GPU) == "4":
            return str(node.metadata.name)
    raise SystemExit("no node advertises 4 GPUs: make cluster-up")


def hog(node: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "hog", "image": "multiworker.local/worker:dev",
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", "3600"],
                                     "resources": {"limits": {GPU: "2"}}}]}}


def job_manifest(name: str, node: str, wait: int) -> Obj:
    job: Obj = yaml.safe_load((REPO / "examples" / "cpu-job.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["workers"] = 3
    job["spec"]["elastic"] = {"minWorkers": 2, "shrinkAfterSeconds": wait,
                              "growAfterSeconds": wait}
    job["spec"]["health"] = {"startupTimeoutSeconds": 600}
    template = job["spec"]["template"]["spec"]
    template["nodeSelector"] = {"kubernetes.io/hostname": node}
    trainer = template["containers"][0]
    trainer["env"] = [{"name": "TRAIN_EPOCHS", "value": "400"}]
    trainer["resources"] = {"requests": {"cpu": "100m", "memory": "512Mi"},
                            "limits": {GPU: "1"}}
    return job


def training(cluster: Cluster, namespace: str, job: str, workers: int) -> bool:
    """A worker of the current generation, of `workers`, reports a step past its restore."""
    s = status(cluster, namespace, job)
    if s.get("totalWorkers") != workers:
        return False
    current = [p for p in pods(cluster, namespace, job)
               if p["metadata"]["labels"].get(GENERATION) == str(s.get("groupGeneration"))]
    for pod in current:
        answer = progress(pod)
        if answer and answer.get("phase") == "training" and \
                (answer.get("step") or 0) > (answer.get("restoredFromStep") or 0):
            return True
    return False


def until(what: str, check: Any, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)
    return time.monotonic()


def one_round(cluster: Cluster, namespace: str, node: str, wait: int, timeout: float
              ) -> tuple[float, float]:
    name = f"elastic-{uuid.uuid4().hex[:4]}"
    cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(hog(node)))
    until("the hog running", lambda: cluster.kubectl(
        "-n", namespace, "get", "pod", "hog", "-o", "jsonpath={.status.phase}") == "Running",
        timeout)
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    stdin=json.dumps(job_manifest(name, node, wait)))
    applied = time.monotonic()
    short = until("training with 2", lambda: training(cluster, namespace, name, 2),
                  timeout) - applied
    until("a checkpoint", lambda: (status(cluster, namespace, name).get("progress") or {})
          .get("lastCheckpointStep"), timeout)
    cluster.kubectl("-n", namespace, "delete", "pod", "hog", "--wait=false")
    freed = time.monotonic()
    back = until("training with 3", lambda: training(cluster, namespace, name, 3),
                 timeout) - freed
    cluster.kubectl("-n", namespace, "delete", "mwj", name, "--wait=true", "--timeout=120s",
                    check=False)
    cluster.kubectl("-n", namespace, "delete", "pod", "hog", "--wait=true", check=False)
    return short, back


def main() -> None:
    args = parse_args()
    cluster = Cluster(REPO / ".cluster" / "kubeconfig")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    node = gpu_node(cluster)
    namespace = f"bench-elastic-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    claim(cluster, namespace, tempfile.mkdtemp(prefix="mwj-bench-ckpt-"))
    log = Path(tempfile.mkdtemp(prefix="mwj-bench-")) / "operator.log"
    rounds: list[tuple[float, float]] = []
    try:
        with operator(cluster, namespace, log):
            for i in range(args.rounds):
                rounds.append(one_round(cluster, namespace, node, args.wait, args.timeout))
                print(f"round {i + 1}: short -> training with 2 of 3 in {rounds[-1][0]:.1f}s, "
                      f"back -> 3 of 3 in {rounds[-1][1]:.1f}s", flush=True)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"bench-{namespace}"[:63], "--wait=false", check=False)
        print(f"operator log: {log}")
    print(f"\nspec.elastic, 3 workers (minWorkers 2) of the CPU example, local cluster, "
          f"shrinkAfter = growAfter = {args.wait}s, {len(rounds)} rounds (seconds)")
    print(f"{'':38} {'median':>8} {'max':>8} {'median - wait':>14}")
    for label, values in (("GPUs short at apply -> training with 2", [r[0] for r in rounds]),
                          ("GPUs back -> training with 3", [r[1] for r in rounds])):
        median = statistics.median(values)
        print(f"{label:38} {median:8.1f} {max(values):8.1f} {median - args.wait:14.1f}")


if __name__ == "__main__":
    main()
