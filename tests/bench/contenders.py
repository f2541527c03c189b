"""The two operators under test, as black boxes: how to install, start and stop each, the job
manifest that wraps the shared pod template, and how to read "running" from each job's status.

Both run as host processes against the same API server, each as its own user (identity.py),
watching only the namespace of the repetition (--namespace), so every figure is one process's.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.bench.harness import (
    BIN,
    IMAGE,
    OPERATOR,
    REPO,
    Cluster,
    Obj,
    http_ok,
    process,
)
from tests.support import free_ports

TFJOB_VERSION = os.environ.get("TRAINING_OPERATOR_VERSION", "v1.8.1")
TFJOB_BIN = BIN / f"training-operator-{TFJOB_VERSION}"
TFJOB_CRD = BIN.parent / f"training-operator-{TFJOB_VERSION}" / "kubeflow.org_tfjobs.yaml"
TFJOB_SECRET = "training-operator-webhook-cert"  # its default --webhook-secret-name
CONTAINER = "tensorflow"  # TFJob's default container name; ours takes any


def pod_spec(grace_seconds: int) -> Obj:
    """The pod template both operators get: `sleep` in the base image (never pulled or run: kwok
    only), one nvidia.com/gpu so it fits nowhere but the fake nodes, which it tolerates."""
    return {
        "terminationGracePeriodSeconds": grace_seconds,
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "multiworker.dev/fake-node", "operator": "Exists",
                         "effect": "NoSchedule"}],
        "containers": [{"name": CONTAINER, "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "infinity"],
                        "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    }


@dataclass
class Running:
    """One live operator process and where its own metrics are served (None: nowhere)."""

    proc: subprocess.Popen[bytes]
    metrics_port: int | None
    started: float = 0.0  # time.monotonic() when it was spawned


@dataclass(frozen=True)
class Contender:
    name: str
    group: str
    version: str
    plural: str
    kind: str
    replaces_group: bool  # a failed worker: the whole group is replaced (else only that pod)
    request_metrics: tuple[str, ...]  # the operator's own request counters, first found wins

    @property
    def api(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    def install(self, cluster: Cluster) -> None:
        raise NotImplementedError

    def prepare(self, cluster: Cluster, namespace: str) -> None:
        """Whatever the namespace needs before the operator starts."""

    def start(self, cluster: Cluster, env: dict[str, str], namespace: str,
              log: Path) -> contextlib.AbstractContextManager[Running]:
        """The operator for `namespace` (env: its own KUBECONFIG), once ready; `cluster` is
        the harness's admin access, for what a kubelet would do for it."""
        raise NotImplementedError

    def manifest(self, name: str, workers: int, spec: Obj) -> Obj:
        raise NotImplementedError

    def running(self, job: Obj, workers: int, since: Obj | None) -> bool:
        """The job's own status says all `workers` run (after `since`, the job as it was when
        a worker failed: a new generation for ours)."""
        raise NotImplementedError

    def failed(self, job: Obj) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Multiworker(Contender):
    backoff_seconds: int = 0
    extra_args: tuple[str, ...] = ()

    def install(self, cluster: Cluster) -> None:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.wait_established(f"{self.plural}.{self.group}")

    @contextlib.contextmanager
    def start(self, cluster: Cluster, env: dict[str, str], namespace: str,
              log: Path) -> Iterator[Running]:
        health, metrics = free_ports(2)
        cmd = [str(OPERATOR), "--identity", "bench", "--namespace", namespace, "--health-port",
               str(health), "--metrics-port", str(metrics), *self.extra_args]
        ready = f"http://127.0.0.1:{health}/healthz"
        with process(cmd, env, log, lambda: http_ok(ready)) as proc:
            yield Running(proc, metrics)

    def manifest(self, name: str, workers: int, spec: Obj) -> Obj:
        return {"apiVersion": f"{self.group}/{self.version}", "kind": self.kind,
                "metadata": {"name": name},
                "spec": {"workers": workers,
                         "restartPolicy": {"backoffSeconds": self.backoff_seconds},
                         "template": {"spec": spec}}}

    def running(self, job: Obj, workers: int, since: Obj | None) -> bool:
        s = job.get("status") or {}
        generation = ((since or {}).get("status") or {}).get("groupGeneration", -1)
        return (s.get("phase") == "Running" and s.get("readyWorkers") == workers
                and s.get("groupGeneration", 0) > generation)

    def failed(self, job: Obj) -> bool:
        return bool((job.get("status") or {}).get("phase") == "Failed")


def conditions(job: Obj) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "")
            for c in (job.get("status") or {}).get("conditions") or []}


@dataclass(frozen=True)
class TFJob(Contender):
    """Kubeflow training-operator (hack/bench/build-tfjob.sh), TFJob scheme only, its defaults:
    one controller thread, no gang scheduling, no leader election. Its certificate rotator
    fills a Secret in the namespace it runs for (MY_POD_NAMESPACE, as its Deployment sets it)
    and waits for the files a Secret volume would give it, which the harness writes
    (mount_secret). No ValidatingWebhookConfiguration is installed, so the API server never
    calls its webhook: a TFJob create costs no admission round trip here."""

    def install(self, cluster: Cluster) -> None:
        if not (TFJOB_BIN.exists() and TFJOB_CRD.exists()):
            raise RuntimeError(f"no {TFJOB_BIN.name}: run flock /tmp/mw-build.lock "
                               "hack/bench/build-tfjob.sh")
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(TFJOB_CRD))
        cluster.wait_established(f"{self.plural}.{self.group}")

    def prepare(self, cluster: Cluster, namespace: str) -> None:
        cluster.core.create_namespaced_secret(
            namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=TFJOB_SECRET)))

    @contextlib.contextmanager
    def start(self, cluster: Cluster, env: dict[str, str], namespace: str,
              log: Path) -> Iterator[Running]:
        health, metrics, webhook = free_ports(3)
        cmd = [str(TFJOB_BIN), "--enable-scheme=tfjob", "--namespace", namespace,
               f"--metrics-bind-address=127.0.0.1:{metrics}",
               f"--health-probe-bind-address=127.0.0.1:{health}",
               f"--webhook-server-port={webhook}"]
        certs = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in its code
        shutil.rmtree(certs, ignore_errors=True)  # left by an earlier run, for another namespace

        def ready() -> bool:  # certificates in place, then its TFJob workers started
            if not (certs / "tls.crt").exists():
                mount_secret(cluster, namespace, certs)
            return (http_ok(f"http://127.0.0.1:{health}/readyz")
                    and "Starting workers" in log.read_text(errors="replace"))

        with process(cmd, dict(env, MY_POD_NAMESPACE=namespace), log, ready, 90) as proc:
            yield Running(proc, metrics)

    def manifest(self, name: str, workers: int, spec: Obj) -> Obj:
        # ExitCode: a worker that exits with a retryable code (137 is) is replaced; the default
        # (Never) would fail the whole job instead.
        return {"apiVersion": f"{self.group}/{self.version}", "kind": self.kind,
                "metadata": {"name": name},
                "spec": {"tfReplicaSpecs": {"Worker": {
                    "replicas": workers, "restartPolicy": "ExitCode",
                    "template": {"spec": spec}}}}}

    def running(self, job: Obj, workers: int, since: Obj | None) -> bool:
        worker = ((job.get("status") or {}).get("replicaStatuses") or {}).get("Worker") or {}
        c = conditions(job)
        return (c.get("Running") == "True" and c.get("Failed") != "True"
                and worker.get("active") == workers)

    def failed(self, job: Obj) -> bool:
        return conditions(job).get("Failed") == "True"


def mount_secret(cluster: Cluster, namespace: str, directory: Path) -> None:
    """What the kubelet does for its Deployment (a Secret volume): its certificate rotator
    fills the Secret, then waits for the files to appear in `directory`."""
    secret: Any = cluster.core.read_namespaced_secret(TFJOB_SECRET, namespace)
    data = secret.data or {}
    if "tls.crt" not in data:
        return
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (directory / f".{key}").write_bytes(base64.b64decode(value))
    for key in data:  # tls.crt last: its presence is what the rotator waits for
        if key != "tls.crt":
            (directory / f".{key}").rename(directory / key)
    (directory / ".tls.crt").rename(directory / "tls.crt")


CONTENDERS: dict[str, Contender] = {
    "multiworker": Multiworker(
        name="multiworker", group="multiworker.dev", version="v1alpha1",
        plural="multiworkerjobs", kind="MultiWorkerJob", replaces_group=True,
        request_metrics=("multiworker_api_requests_total", "rest_client_requests_total")),
    "tfjob": TFJob(
        name="tfjob", group="kubeflow.org", version="v1", plural="tfjobs", kind="TFJob",
        replaces_group=False, request_metrics=("rest_client_requests_total",)),
}
