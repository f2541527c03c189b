"""Kueue admission, side by side: MultiWorkerJob (operator --kueue, an external framework of
Kueue) against a Kubeflow TFJob admitted by Kueue's own kubeflow integration, with real
TensorFlow workers on the local cluster (not part of CI).

    .venv/bin/python tests/bench/bench_kueue.py [--quick] [--reps 5]
        [--contenders multiworker,tfjob,tfjob-plain] [--scenarios handover,preemption]

Needs the local cluster (make cluster-up), Kueue (hack/cluster/kueue.sh; run here, idempotent),
the worker image in the node (hack/images/build.sh worker && hack/images/load.sh worker) and,
for TFJob, training-operator v1.8.1 (flock /tmp/mw-build.lock hack/bench/build-tfjob.sh).
The whole run holds the cluster lock (/tmp/mw-cluster.lock; --no-lock when the caller does).

Each repetition of each contender gets a fresh namespace, a ClusterQueue of its own that admits
only that namespace (quota 300m CPU, 8Gi memory: one job of two 100m workers at a time; the
node has room for more, so only Kueue makes a job wait; preemption withinClusterQueue
LowerPriority), a LocalQueue, a hostPath-backed ReadWriteMany claim `checkpoints` (as the e2e
tier's checkpoint_claim) and its operator as a host process watching only that namespace (the
admin kubeconfig). Both contenders run the same pods: the worker image
multiworker.local/worker:dev running examples/training/train.py (2 workers, 10 steps an epoch,
100m CPU / 256Mi each, terminationGracePeriodSeconds 20). Everything is observed by polling
the API (kubernetes client, one list of jobs, Workloads and pods per poll, every --interval s
on a monotonic clock): the Workloads' conditions carry 1 s timestamps, too coarse here.

1. handover: job A running, job B applied (Queued: no quota). From A's Workload Finished to
   B's Workload admitted (QuotaReserved and Admitted True) and to B Running (all workers
   running by its own status: ours phase Running with readyWorkers 2; TFJob condition Running
   with 2 active workers).
2. preemption: job `low` (WorkloadPriorityClass mwbench-low, checkpoints on the claim) trains
   past step 20 (its epoch line of step 30), then for a random part of an epoch (up to
   --offset-max s, seeded by the repetition: the same for every contender), then `high`
   (mwbench-high) is applied. From that apply to: low's Workload Evicted; low suspended by
   its own object (ours: phase Queued; TFJob: spec.runPolicy.suspend); low's containers all
   exited; low's pod objects all gone (deleted from the API); low's quota released (its
   Workload's QuotaReserved False); high admitted; high Running. Steps lost for `low` = the
   last step its trainers reached before they stopped (their log line "checkpointed step N
   and stopped", else the last step seen) minus the step its next group resumed from once
   `high` finished and `low` was admitted again (log "resuming from step N"; ours also
   reports status.progress.resumedFromStep, read once the chief has trained past that step:
   until its restore is done the chief reports restoredFromStep 0, and the status shows 0
   for a moment). Then everything in the namespace is deleted.

TFJob: training-operator runs as a host process (as tests/bench/contenders.py starts it for
bench_side_by_side), its CRD from the same Go module. Kueue manages TFJobs only with the
framework "kubeflow.org/tfjob" in its controller config, which hack/cluster/kueue.sh does not
enable: this bench adds it to the kueue-manager-config ConfigMap and restarts the
kueue-controller-manager Deployment (once the TFJob CRD exists), and puts the original config
back (and restarts it again) at the end. Kueue's manifests already register its TFJob webhooks
(mtfjob/vtfjob.kb.io: with the framework off they answer as no-ops): its mutating webhook sets
spec.runPolicy.suspend on a queued TFJob; admission clears it; preemption sets it again,
training-operator then deletes the job's pods (with their grace period) and services and
reports no active pod at once, and Kueue releases the quota then: before the pods' containers
have exited (measured here). The TFJob's pods get the claim mounted at /checkpoints
and MWJ_CHECKPOINT_DIR set by hand; train.py needs only TF_CONFIG (the MWJ_* variables are
optional), so the same script runs under both. NOTE on steps lost: the trainer's SIGTERM
handling (all workers agree on a step, checkpoint it, exit 143) lives in the multiworker
runtime library inside train.py, not in the operator; under TFJob it therefore works as well
whenever both workers get SIGTERM with their peers still up, which is what training-operator's
deletion of a suspended TFJob's pods gives. So a third contender, tfjob-plain (preemption
only), is the same TFJob with a trainer that has no SIGTERM handler, as a plain TensorFlow
script: sh as the container's PID 1 takes the SIGTERM, logs the step the trainer reached (its
GET /progress) and SIGKILLs it (survivor saves off); it checkpoints at each epoch end (every 10
steps here; real jobs checkpoint far less often, and lose proportionally more), so it loses the
steps since its last epoch end.

Figures: seconds, from polls every --interval (0.15 s: each figure is within about one poll,
~0.15-0.3 s on this 2-core machine, of the moment it happened). "quota released before its
containers exited by" is the time the preempted job's pods still ran after Kueue counted its
quota as free (> 0: the new job may start beside them; 0: in the same poll).

Side effect on the shared cluster: with TFJob among the contenders, Kueue's manager restarts
twice (about 12 s each), during which its webhooks do not answer; the run holds the cluster
lock. Everything created here is named mwbench-* / bench-kueue-* and deleted at the end.

Prints one table: medians of the repetitions per contender, and n.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.contenders import CONTENDERS, TFJOB_BIN, TFJOB_CRD
from tests.bench.harness import (
    CLUSTER_LOCK,
    REPO,
    Cluster,
    Obj,
    cluster_lock,
    operator,
    wait_for,
)
from tests.bench.report import Value, fmt, median

KUEUE = ("kueue.x-k8s.io", "v1beta2")
KUEUE_NS, KUEUE_DEPLOY, KUEUE_CM = "kueue-system", "kueue-controller-manager", "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
TFJOB_FRAMEWORK = "kubeflow.org/tfjob"
TRAIN = "/opt/multiworker/examples/training/train.py"
IMAGE = "multiworker.local/worker:dev"
FLAVOR = "mwbench-default"
PRIORITIES = {"mwbench-low": 100, "mwbench-high": 1000}
QUEUE = "team"
WORKERS = 2
STEPS_PER_EPOCH = 10
SHARED_DIR = "/var/lib/multiworker"  # tests/cluster.py LOCAL_SHARED_DIR: the node's disk
STOPPED = re.compile(r"(?:checkpointed step|stopped at step|SIGTERM at step) (\d+)")
SAVED = re.compile(r"checkpointed step (\d+)")
RESUMED = re.compile(r"resuming from step (\d+)")
EPOCH_DONE = re.compile(r"epoch \d+/\d+ done: step (\d+)")


# --- the two contenders -------------------------------------------------------------------

class Kind:
    """What differs between a MultiWorkerJob and a TFJob: manifest, pods, "running"."""

    name = ""
    group = version = plural = pod_label = ""
    scenarios: tuple[str, ...] = ("handover", "preemption")

    def manifest(self, ns: str, name: str, epochs: int, step_sleep: float,
                 priority: str | None, checkpoint: bool) -> Obj:
        raise NotImplementedError

    def running(self, job: Obj) -> bool:
        raise NotImplementedError

    def suspended(self, job: Obj) -> bool:
        """The job's own object says it waits for Kueue again."""
        raise NotImplementedError

    def operator(self, cluster: Cluster, ns: str, log: Path
                 ) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def prepare(self, cluster: Cluster, ns: str) -> None:
        """Whatever the namespace needs before the operator starts."""


def container(epochs: int, step_sleep: float, extra_env: dict[str, str]) -> Obj:
    env = {"TRAIN_EPOCHS": str(epochs), "TRAIN_STEPS_PER_EPOCH": str(STEPS_PER_EPOCH),
           "TRAIN_TARGET_LOSS": "1000", "TRAIN_STEP_SLEEP": str(step_sleep), **extra_env}
    return {"name": "tensorflow", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "args": ["python3", TRAIN], "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}


def labels(priority: str | None) -> dict[str, str]:
    out = {"kueue.x-k8s.io/queue-name": QUEUE}
    if priority:
        out["kueue.x-k8s.io/priority-class"] = priority
    return out


class MultiWorker(Kind):
    name, group, version, plural = "multiworker", "multiworker.dev", "v1alpha1", "multiworkerjobs"
    pod_label = "multiworker.dev/job-name"

    def manifest(self, ns: str, name: str, epochs: int, step_sleep: float,
                 priority: str | None, checkpoint: bool) -> Obj:
        spec: Obj = {"workers": WORKERS, "restartPolicy": {"maxRestarts": 0},
                     "template": {"spec": {"terminationGracePeriodSeconds": 20,
                                           "containers": [container(epochs, step_sleep, {})]}}}
        if checkpoint:
            spec["checkpoint"] = {"claimName": "checkpoints"}
        return {"apiVersion": f"{self.group}/{self.version}", "kind": "MultiWorkerJob",
                "metadata": {"name": name, "labels": labels(priority)}, "spec": spec}

    def running(self, job: Obj) -> bool:
        s = job.get("status") or {}
        return bool(s.get("phase") == "Running" and s.get("readyWorkers") == WORKERS)

    def suspended(self, job: Obj) -> bool:
        return bool((job.get("status") or {}).get("phase") == "Queued")

    def operator(self, cluster: Cluster, ns: str, log: Path
                 ) -> contextlib.AbstractContextManager[Any]:
        return operator(cluster, ns, log, "--kueue")


class TFJobKind(Kind):
    name, group, version, plural = "tfjob", "kubeflow.org", "v1", "tfjobs"
    pod_label = "training.kubeflow.org/job-name"

    def manifest(self, ns: str, name: str, epochs: int, step_sleep: float,
                 priority: str | None, checkpoint: bool) -> Obj:
        extra = {"MWJ_CHECKPOINT_DIR": f"/checkpoints/{ns}/{name}"} if checkpoint else {}
        pod: Obj = {"terminationGracePeriodSeconds": 20,
                    "containers": [container(epochs, step_sleep, extra)]}
        if checkpoint:
            pod["containers"][0]["volumeMounts"] = [{"name": "checkpoints",
                                                     "mountPath": "/checkpoints"}]
            pod["volumes"] = [{"name": "checkpoints",
                               "persistentVolumeClaim": {"claimName": "checkpoints"}}]
        return {"apiVersion": f"{self.group}/{self.version}", "kind": "TFJob",
                "metadata": {"name": name, "labels": labels(priority)},
                "spec": {"tfReplicaSpecs": {"Worker": {
                    "replicas": WORKERS, "restartPolicy": "Never",
                    "template": {"spec": pod}}}}}

    def running(self, job: Obj) -> bool:
        status = job.get("status") or {}
        worker = (status.get("replicaStatuses") or {}).get("Worker") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        return bool(conditions.get("Running") == "True" and conditions.get("Suspended") != "True"
                    and worker.get("active") == WORKERS)

    def suspended(self, job: Obj) -> bool:
        return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    def prepare(self, cluster: Cluster, ns: str) -> None:
        CONTENDERS["tfjob"].prepare(cluster, ns)  # the Secret its certificate rotator fills

    def operator(self, cluster: Cluster, ns: str, log: Path
                 ) -> contextlib.AbstractContextManager[Any]:
        return CONTENDERS["tfjob"].start(cluster, cluster.env, ns, log)


# tfjob-plain: a trainer with no SIGTERM handler of its own. sh (the container's PID 1) takes
# the kubelet's SIGTERM, logs the step the trainer reached (its GET /progress, port 8471) and
# SIGKILLs it, as SIGTERM's default action would end a plain TensorFlow script; survivor saves
# are off. Its checkpoints: each epoch end (train.py's default), restored on resume.
PLAIN_WRAPPER = f"""python3 {TRAIN} & pid=$!
trap 'step=$(python3 -c "import json, urllib.request as u; print(json.load(u.urlopen(\\"http://127.0.0.1:8471/progress\\", timeout=2))[\\"step\\"])" 2>/dev/null); echo "plain trainer: SIGTERM at step $step: killed"; kill -9 $pid' TERM
while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
exit $rc
"""


class TFJobPlain(TFJobKind):
    name = "tfjob-plain"
    scenarios = ("preemption",)  # its handover is tfjob's

    def manifest(self, ns: str, name: str, epochs: int, step_sleep: float,
                 priority: str | None, checkpoint: bool) -> Obj:
        job = super().manifest(ns, name, epochs, step_sleep, priority, checkpoint)
        c = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        c["command"], c["args"] = ["sh", "-c", PLAIN_WRAPPER], []
        c["env"].append({"name": "MWJ_SURVIVOR_SAVES", "value": "0"})
        return job


KINDS: dict[str, Kind] = {"multiworker": MultiWorker(), "tfjob": TFJobKind(),
                          "tfjob-plain": TFJobPlain()}


# --- observing a namespace ----------------------------------------------------------------

def condition(obj: Obj | None, type_: str) -> Obj:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), {})


def is_true(obj: Obj | None, type_: str) -> bool:
    return condition(obj, type_).get("status") == "True"


def admitted(workload: Obj | None) -> bool:
    return is_true(workload, "QuotaReserved") and is_true(workload, "Admitted")


class Snapshot:
    """One poll: jobs by name, Workloads by owner name, pods by job name."""

    def __init__(self, jobs: dict[str, Obj], workloads: dict[str, Obj],
                 pods: dict[str, list[Obj]]) -> None:
        self.jobs, self.workloads, self.pods = jobs, workloads, pods


class Namespace:
    """Polls one namespace of one contender; follows every training container's log."""

    def __init__(self, cluster: Cluster, kind: Kind, ns: str, interval: float) -> None:
        self.cluster, self.kind, self.ns, self.interval = cluster, kind, ns, interval
        self.logs: dict[str, list[str]] = {}  # pod uid -> lines
        self.pod_job: dict[str, str] = {}  # pod uid -> job name
        self.pod_seen: dict[str, float] = {}  # pod uid -> first seen (monotonic)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _list(self, group: str, version: str, plural: str) -> list[Obj]:
        response: Any = self.cluster.custom.list_namespaced_custom_object(
            group, version, self.ns, plural, _preload_content=False)
        return list(json.loads(response.data)["items"])

    def poll(self) -> Snapshot:
        jobs = {j["metadata"]["name"]: j
                for j in self._list(self.kind.group, self.kind.version, self.kind.plural)}
        workloads: dict[str, Obj] = {}
        for w in self._list(*KUEUE, "workloads"):
            owners = w["metadata"].get("ownerReferences") or [{}]
            workloads[owners[0].get("name", "")] = w
        response: Any = self.cluster.core.list_namespaced_pod(
            self.ns, label_selector=self.kind.pod_label, _preload_content=False)
        pods: dict[str, list[Obj]] = {}
        for p in json.loads(response.data)["items"]:
            job = p["metadata"]["labels"][self.kind.pod_label]
            pods.setdefault(job, []).append(p)
            self._follow(p, job)
        return Snapshot(jobs, workloads, pods)

    def _follow(self, pod: Obj, job: str) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self.logs:
            return
        self.logs[uid], self.pod_job[uid] = [], job
        self.pod_seen[uid] = time.monotonic()
        t = threading.Thread(target=self._tail, args=(pod["metadata"]["name"], uid),
                             daemon=True, name=f"log-{pod['metadata']['name']}")
        t.start()
        self._threads.append(t)

    def _tail(self, name: str, uid: str) -> None:
        """The container's log while it lives: retried until it starts; a later pod of the
        same name (TFJob reuses names) is another uid, never read here."""
        lines = self.logs[uid]
        while not self._stop.is_set():
            try:
                pod: Any = self.cluster.core.read_namespaced_pod(name, self.ns)
                if pod.metadata.uid != uid:
                    return
                stream: Any = self.cluster.core.read_namespaced_pod_log(
                    name, self.ns, container="tensorflow", follow=True,
                    _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    return
                time.sleep(0.5)  # 400 while the container is being created
                continue
            except Exception:  # noqa: BLE001 — a connection reset: try again
                time.sleep(0.5)
                continue
            buffer = b""
            with contextlib.suppress(Exception):  # the pod went away mid-stream
                for chunk in stream.stream(amt=4096, decode_content=True):
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    lines.extend(line.decode(errors="replace") for line in complete)
                    if self._stop.is_set():
                        break
            if buffer:
                lines.append(buffer.decode(errors="replace"))
            return

    def lines(self, job: str, since: float = 0.0) -> list[str]:
        return [line for uid, lines in list(self.logs.items())
                if self.pod_job[uid] == job and self.pod_seen[uid] >= since for line in lines]

    def until(self, marks: dict[str, Callable[[Snapshot], bool]], timeout: float,
              start: float | None = None, done: Callable[[dict[str, float]], bool] | None = None
              ) -> dict[str, float]:
        """Polls until every mark was seen (or `done` says so): seconds from `start` (default:
        now) at the first poll that saw each. A mark seen never stays seen: once is enough."""
        start = time.monotonic() if start is None else start
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        last: Snapshot | None = None
        while True:
            before = time.monotonic()
            last = self.poll()
            for key, predicate in marks.items():
                if key not in seen and predicate(last):
                    seen[key] = before - start
            if len(seen) == len(marks) or (done and done(seen)):
                return seen
            if time.monotonic() > deadline:
                missing = sorted(set(marks) - set(seen))
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {missing}; "
                                     f"{describe(last)}")
            time.sleep(max(0.0, self.interval - (time.monotonic() - before)))

    def close(self) -> None:
        self._stop.set()


def describe(s: Snapshot | None) -> str:
    if s is None:
        return "nothing polled"
    parts = []
    for name, job in s.jobs.items():
        status = job.get("status") or {}
        w = s.workloads.get(name)
        parts.append(
            f"{name}: phase {status.get('phase')} conditions "
            f"{[c.get('type') for c in status.get('conditions') or [] if c.get('status') == 'True']}"
            f" workload {[c['type'] for c in (w or {}).get('status', {}).get('conditions') or [] if c.get('status') == 'True']}"
            f" pods {[p['status'].get('phase') for p in s.pods.get(name, [])]}")
    return "; ".join(parts)


# --- the cluster: Kueue's config, queues, claim ----------------------------------------------

def apply(cluster: Cluster, obj: Obj, ns: str | None = None) -> None:
    where = ("-n", ns) if ns else ()
    cluster.kubectl(*where, "apply", "--server-side", "--force-conflicts",
                    "--field-manager", "bench-kueue", "-f", "-", stdin=json.dumps(obj))


def kueue_config(cluster: Cluster) -> str:
    cm: Any = cluster.core.read_namespaced_config_map(KUEUE_CM, KUEUE_NS)
    return str(cm.data[KUEUE_CONFIG_KEY])


def set_kueue_config(cluster: Cluster, text: str) -> None:
    """The controller config, then a restart of the manager (it reads it once) and a wait for
    the new pod to serve its webhooks."""
    cluster.core.patch_namespaced_config_map(KUEUE_CM, KUEUE_NS, {"data": {KUEUE_CONFIG_KEY: text}})
    cluster.kubectl("-n", KUEUE_NS, "rollout", "restart", f"deploy/{KUEUE_DEPLOY}")
    cluster.kubectl("-n", KUEUE_NS, "rollout", "status", f"deploy/{KUEUE_DEPLOY}",
                    "--timeout=180s")
    probe = json.dumps({"apiVersion": f"{KUEUE[0]}/{KUEUE[1]}", "kind": "ResourceFlavor",
                        "metadata": {"name": "mwbench-kueue-probe"}})
    wait_for(lambda: _dry_run_ok(cluster, probe), 120, 1,
             "Kueue's webhooks answer after its restart")


def _dry_run_ok(cluster: Cluster, manifest: str) -> bool:
    try:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=manifest)
    except RuntimeError:
        return False
    return True


def tfjob_webhook_suspends(cluster: Cluster, ns: str) -> bool:
    """Kueue's TFJob webhook is live (not its no-op): a queued TFJob comes back suspended."""
    job = TFJobKind().manifest(ns, "probe", 1, 0, None, False)
    try:
        out = cluster.kubectl("-n", ns, "create", "--dry-run=server", "-o", "json", "-f", "-",
                              stdin=json.dumps(job))
    except RuntimeError:
        return False
    return bool(((json.loads(out).get("spec") or {}).get("runPolicy") or {}).get("suspend"))


@contextlib.contextmanager
def kueue_with_tfjob(cluster: Cluster) -> Iterator[None]:
    """Kueue managing TFJobs for the block; its original config (and a restart) after."""
    original = kueue_config(cluster)
    if TFJOB_FRAMEWORK in original:
        yield
        return
    marker = '  - "batch/job"\n'
    if marker not in original:
        raise RuntimeError(f"{KUEUE_CM}: no '{marker.strip()}' entry to add {TFJOB_FRAMEWORK} "
                           "after (has hack/cluster/kueue.sh changed?)")
    print(f"kueue: adding {TFJOB_FRAMEWORK} to its frameworks, restarting it", file=sys.stderr)
    t = time.monotonic()
    try:
        set_kueue_config(cluster, original.replace(marker, f'{marker}  - "{TFJOB_FRAMEWORK}"\n'))
        print(f"kueue: restarted in {time.monotonic() - t:.0f}s", file=sys.stderr)
        yield
    finally:
        print("kueue: restoring its original config, restarting it", file=sys.stderr)
        set_kueue_config(cluster, original)
        if kueue_config(cluster) != original:
            print("kueue: WARNING: the config did not come back as it was", file=sys.stderr)


def cluster_queue(name: str, ns: str) -> Obj:
    return {"apiVersion": f"{KUEUE[0]}/{KUEUE[1]}", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                    {"name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "300m"},
                                                   {"name": "memory", "nominalQuota": "8Gi"}]}]}]}}


def shared_objects(cluster: Cluster, create: bool) -> None:
    """The flavor and priority classes every repetition shares (ours: mwbench-*)."""
    if create:
        apply(cluster, {"apiVersion": f"{KUEUE[0]}/{KUEUE[1]}", "kind": "ResourceFlavor",
                        "metadata": {"name": FLAVOR}, "spec": {}})
        for name, value in PRIORITIES.items():
            apply(cluster, {"apiVersion": f"{KUEUE[0]}/{KUEUE[1]}",
                            "kind": "WorkloadPriorityClass", "metadata": {"name": name},
                            "value": value})
        return
    cluster.kubectl("delete", "workloadpriorityclass", *PRIORITIES, "--ignore-not-found",
                    check=False)
    cluster.kubectl("delete", "resourceflavor", FLAVOR, "--ignore-not-found", "--wait=false",
                    check=False)


def claim(cluster: Cluster, ns: str) -> str:
    """A ReadWriteMany claim `checkpoints` bound to a hostPath volume of this namespace alone
    (tests/e2e/conftest.py checkpoint_claim, local cluster); returns the volume's name."""
    volume = f"mwbench-{ns}"[:63]
    apply(cluster, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                             "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                             "claimRef": {"namespace": ns, "name": "checkpoints"},
                             "hostPath": {"path": f"{SHARED_DIR}/bench/{ns}",
                                          "type": "DirectoryOrCreate"}}})
    apply(cluster, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "checkpoints"},
                    "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                             "resources": {"requests": {"storage": "1Gi"}}}}, ns)
    return volume


# --- the scenarios ----------------------------------------------------------------------------

def create(cluster: Cluster, kind: Kind, ns: str, manifest: Obj) -> None:
    cluster.custom.create_namespaced_custom_object(kind.group, kind.version, ns, kind.plural,
                                                   manifest)


def delete_jobs(cluster: Cluster, kind: Kind, watch: Namespace, timeout: float) -> None:
    """Every job (its operator still running, so it lets go of pods and Workloads), then wait
    until no pod and no Workload is left."""
    cluster.custom.delete_collection_namespaced_custom_object(
        kind.group, kind.version, watch.ns, kind.plural)
    watch.until({"clean": lambda s: not s.jobs and not s.workloads and not s.pods}, timeout)


def handover(cluster: Cluster, kind: Kind, watch: Namespace, args: argparse.Namespace
             ) -> dict[str, float | str]:
    ns = watch.ns
    create(cluster, kind, ns, kind.manifest(ns, "a", args.a_epochs, 0.3, None, False))
    watch.until({"a running": lambda s: kind.running(s.jobs.get("a") or {})}, args.timeout)
    create(cluster, kind, ns, kind.manifest(ns, "b", 1, 0.0, None, False))
    early = watch.until({"b queued": lambda s: "b" in s.workloads and
                         not is_true(s.workloads["b"], "QuotaReserved"),
                         "a finished": lambda s: is_true(s.workloads.get("a"), "Finished")},
                        60, done=lambda seen: "b queued" in seen or "a finished" in seen)
    if "b queued" not in early:
        delete_jobs(cluster, kind, watch, args.timeout)
        return {"handover_error": "A finished before B was seen waiting"}
    marks = watch.until({
        "a finished": lambda s: is_true(s.workloads.get("a"), "Finished"),
        "b admitted": lambda s: admitted(s.workloads.get("b")),
        "b running": lambda s: kind.running(s.jobs.get("b") or {}),
    }, args.timeout)
    figures: dict[str, float | str] = {
        "ho_admit": marks["b admitted"] - marks["a finished"],
        "ho_running": marks["b running"] - marks["a finished"],
        "ho_admit_running": marks["b running"] - marks["b admitted"]}
    delete_jobs(cluster, kind, watch, args.timeout)
    return figures


def stopped(pod: Obj) -> bool:
    """Its containers ran and are done: phase Succeeded or Failed, or every one terminated."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and all("terminated" in (c.get("state") or {}) for c in containers)


def last_step(watch: Namespace, pods: set[str], polled: int) -> int:
    """The last step the trainers of `pods` (uids) reached before they stopped: their stop
    line, else the last epoch line or the step seen before the preemption, whichever is
    higher."""
    lines = [line for uid in pods for line in watch.logs.get(uid, [])]
    stopped = [int(m[1]) for line in lines if (m := STOPPED.search(line))]
    if stopped:
        return max(stopped)
    epochs = [int(m[1]) for line in lines if (m := EPOCH_DONE.search(line))]
    return max([polled, *epochs])


def preemption(cluster: Cluster, kind: Kind, watch: Namespace, args: argparse.Namespace
               ) -> dict[str, float | str]:
    ns = watch.ns
    create(cluster, kind, ns, kind.manifest(ns, "low", 60, 0.1, "mwbench-low", True))
    watch.until({"low running": lambda s: kind.running(s.jobs.get("low") or {})}, args.timeout)
    polled = 0

    def past_step_20(_: Snapshot) -> bool:
        nonlocal polled
        steps = [int(m[1]) for line in watch.lines("low") if (m := EPOCH_DONE.search(line))]
        polled = max(steps or [0])
        return polled > 20

    watch.until({"trained": past_step_20}, args.timeout)
    # Epoch lines come every 10 steps, just after the epoch's checkpoint: a random part of an
    # epoch more (the same for every contender in a repetition), so that the preemption does
    # not always land right after a periodic checkpoint.
    time.sleep(random.Random(args.rep).uniform(0, args.offset_max))
    first_pods = {p["metadata"]["uid"] for p in watch.poll().pods.get("low", [])}
    start = time.monotonic()
    create(cluster, kind, ns, kind.manifest(ns, "high", 2, 0.0, "mwbench-high", False))
    marks = watch.until({
        "evicted": lambda s: is_true(s.workloads.get("low"), "Evicted"),
        "suspended": lambda s: kind.suspended(s.jobs.get("low") or {}),
        "stopped": lambda s: all(stopped(p) for p in s.pods.get("low", [])
                                 if p["metadata"]["uid"] in first_pods),
        "pods gone": lambda s: not any(p["metadata"]["uid"] in first_pods
                                       for p in s.pods.get("low", [])),
        "released": lambda s: "low" in s.workloads and
        not is_true(s.workloads["low"], "QuotaReserved"),
        "high admitted": lambda s: admitted(s.workloads.get("high")),
        "high running": lambda s: kind.running(s.jobs.get("high") or {}),
    }, args.timeout, start=start)
    stopped_at = last_step(watch, first_pods, polled)
    # `high` finishes; `low` is admitted again and resumes.
    resumed_since = time.monotonic()

    def resumed(_: Snapshot) -> bool:  # its "resuming" line, or training without one (step 0)
        return any(RESUMED.search(line) or EPOCH_DONE.search(line)
                   for line in watch.lines("low", resumed_since))

    watch.until({"resumed": resumed}, args.timeout * 2)
    found = [int(m[1]) for line in watch.lines("low", resumed_since)
             if (m := RESUMED.search(line))]
    resumed_from = max(found) if found else 0
    figures: dict[str, float | str] = {
        "pre_evicted": marks["evicted"], "pre_suspended": marks["suspended"],
        "pre_stopped_all": marks["stopped"],
        "pre_pods_gone": marks["pods gone"],
        "pre_released": marks["released"], "pre_high_admitted": marks["high admitted"],
        "pre_high_running": marks["high running"],
        "pre_stopped": float(stopped_at), "pre_resumed": float(resumed_from),
        "pre_lost": float(stopped_at - resumed_from),
        "pre_overlap": marks["stopped"] - marks["released"],
        "pre_sigterm_save": "yes" if any(SAVED.search(line) for uid in first_pods
                                         for line in watch.logs.get(uid, [])) else "no"}
    if isinstance(kind, MultiWorker):
        # The operator copies the chief's /progress, which says restoredFromStep 0 until the
        # restore is done: read it once the chief reports a step past the one it resumed from.
        def progress() -> Obj:
            job = watch.poll().jobs.get("low") or {}
            return dict((job.get("status") or {}).get("progress") or {})

        with contextlib.suppress(AssertionError):
            wait_for(lambda: (progress().get("step") or 0) > resumed_from, 30, 0.5)
        value = progress().get("resumedFromStep")
        figures["pre_status_resumed"] = float(value) if value is not None else "none"
    delete_jobs(cluster, kind, watch, args.timeout)
    return figures


def run_unit(cluster: Cluster, kind: Kind, rep: int, args: argparse.Namespace, logs: Path
             ) -> dict[str, float | str]:
    ns = f"bench-kueue-{kind.name[:5]}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    queue = f"mwbench-{ns}"[:63]
    volume = ""
    watch = Namespace(cluster, kind, ns, args.interval)
    args.rep = rep
    figures: dict[str, float | str] = {}
    try:
        apply(cluster, cluster_queue(queue, ns))
        apply(cluster, {"apiVersion": f"{KUEUE[0]}/{KUEUE[1]}", "kind": "LocalQueue",
                        "metadata": {"name": QUEUE, "namespace": ns},
                        "spec": {"clusterQueue": queue}}, ns)
        volume = claim(cluster, ns)
        kind.prepare(cluster, ns)
        if isinstance(kind, TFJobKind):
            wait_for(lambda: tfjob_webhook_suspends(cluster, ns), 60, 1,
                     "Kueue's TFJob webhook suspends a queued TFJob")
        with kind.operator(cluster, ns, logs / f"{ns}.log"):
            for scenario in [s for s in args.scenario_list if s in kind.scenarios]:
                try:
                    result = (handover if scenario == "handover" else preemption)(
                        cluster, kind, watch, args)
                except (AssertionError, RuntimeError, ApiException) as e:
                    text = str(e).strip().splitlines()[0]
                    print(f"  {scenario} rep {rep} {kind.name}: FAILED: {text}",
                          file=sys.stderr, flush=True)
                    result = {f"{scenario}_error": text[:70]}
                    with contextlib.suppress(AssertionError, ApiException):
                        delete_jobs(cluster, kind, watch, args.timeout)
                figures.update(result)
                print(f"  {scenario} rep {rep} {kind.name}: "
                      + ", ".join(f"{k} {fmt(v)}" for k, v in result.items()),
                      file=sys.stderr, flush=True)
        if args.keep_logs:
            (logs / f"{ns}.trainers.log").write_text("\n".join(
                f"{watch.pod_job[uid]} {uid[:8]} {line}" for uid, lines in watch.logs.items()
                for line in lines))
    finally:
        watch.close()
        teardown(cluster, kind, ns, queue, volume)
    return figures


def teardown(cluster: Cluster, kind: Kind, ns: str, queue: str, volume: str) -> None:
    """The namespace, its ClusterQueue and volume; a job left behind loses its finalizers (its
    operator is gone by now)."""
    with contextlib.suppress(ApiException):
        listed: Any = cluster.custom.list_namespaced_custom_object(
            kind.group, kind.version, ns, kind.plural)
        for job in listed["items"]:
            if job["metadata"].get("finalizers"):
                cluster.custom.patch_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, job["metadata"]["name"],
                    {"metadata": {"finalizers": None}})
    cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", check=False)
    cluster.kubectl("delete", "clusterqueue", queue, "--ignore-not-found", "--timeout=60s",
                    check=False)
    if volume:
        cluster.kubectl("delete", "pv", volume, "--ignore-not-found", "--wait=false",
                        check=False)
        with contextlib.suppress(OSError):  # the local node's disk is this machine's
            shutil.rmtree(f"{SHARED_DIR}/bench/{ns}")


# --- the table ---------------------------------------------------------------------------------

ROWS: list[tuple[str, str]] = [
    ("ho_admit", "handover: A Workload Finished -> B Workload admitted, s"),
    ("ho_running", "handover: A Workload Finished -> B all workers Running, s"),
    ("ho_admit_running", "handover: B Workload admitted -> B Running, s"),
    ("handover_error", "handover: error"),
    ("pre_evicted", "preemption: high applied -> low Workload Evicted, s"),
    ("pre_suspended", "preemption: high applied -> low suspended (own object), s"),
    ("pre_stopped_all", "preemption: high applied -> low's containers all exited, s"),
    ("pre_pods_gone", "preemption: high applied -> low's pods all deleted (API), s"),
    ("pre_released", "preemption: high applied -> low quota released, s"),
    ("pre_overlap", "preemption: low's quota released before its containers exited by, s"),
    ("pre_high_admitted", "preemption: high applied -> high Workload admitted, s"),
    ("pre_high_running", "preemption: high applied -> high all workers Running, s"),
    ("pre_stopped", "preemption: low's last step before it stopped"),
    ("pre_resumed", "preemption: low resumed from step (trainer log)"),
    ("pre_status_resumed", "preemption: low status.progress.resumedFromStep"),
    ("pre_lost", "preemption: low steps lost (last step - resumed from)"),
    ("pre_sigterm_save", "preemption: low checkpointed on SIGTERM"),
    ("preemption_error", "preemption: error"),
]

def table(results: dict[str, dict[str, list[Value]]], names: list[str],
          unavailable: dict[str, str]) -> str:
    head = ["measurement (medians)", *names, "n"]
    rows = [head]
    for key, label in ROWS:
        cells = [results.get(n, {}).get(key, []) for n in names]
        if not any(cells):
            continue
        shown = [unavailable.get(n) or fmt(median(c)) or "-"
                 for n, c in zip(names, cells, strict=True)]
        rows.append([label, *shown, "/".join(str(len(c)) for c in cells)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


# --- main ----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    p.add_argument("--contenders", default="multiworker,tfjob,tfjob-plain")
    p.add_argument("--scenarios", default="handover,preemption")
    p.add_argument("--interval", type=float, default=0.15, help="poll interval, s")
    p.add_argument("--timeout", type=float, default=300, help="one wait, s")
    p.add_argument("--a-epochs", type=int, default=4,
                   help="handover: job A's epochs (10 steps of 0.3 s each)")
    p.add_argument("--offset-max", type=float, default=1.0,
                   help="preemption: up to this many seconds (random, seeded by the "
                   "repetition) after low's step 30 (about one 10-step epoch here)")
    p.add_argument("--keep-logs", action="store_true", help="write the trainers' logs too")
    p.add_argument("--lock", default=CLUSTER_LOCK)
    p.add_argument("--no-lock", action="store_true", help="the caller holds the cluster lock")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 rep")
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 1
    args.contender_list = [c for c in args.contenders.split(",") if c]
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    unknown = (set(args.contender_list) - set(KINDS)) | (
        set(args.scenario_list) - {"handover", "preemption"})
    if unknown or args.reps < 1:
        p.error(f"unknown: {', '.join(sorted(unknown))}" if unknown else "--reps at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cluster = Cluster(Path(os.environ.get("KUBECONFIG", REPO / ".cluster/kubeconfig")))
    logs = Path(tempfile.mkdtemp(prefix="mw-bench-kueue-"))
    print(f"operator logs in {logs}", file=sys.stderr)
    results: dict[str, dict[str, list[Value]]] = {}
    unavailable: dict[str, str] = {}
    names = args.contender_list
    started = time.monotonic()
    with cluster_lock(args.lock, hold=not args.no_lock):
        cluster.run(REPO / "hack/cluster/up.sh")
        cluster.run(REPO / "hack/cluster/kueue.sh")
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.wait_established("multiworkerjobs.multiworker.dev")
        kinds = [KINDS[n] for n in names]
        if any(isinstance(k, TFJobKind) for k in kinds):
            if not (TFJOB_BIN.exists() and TFJOB_CRD.exists()):
                for k in kinds:
                    if isinstance(k, TFJobKind):
                        unavailable[k.name] = "n/a: training-operator not built"
                kinds = [k for k in kinds if not isinstance(k, TFJobKind)]
            else:
                cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                                str(TFJOB_CRD))
                cluster.wait_established("tfjobs.kubeflow.org")
        tfjob = any(isinstance(k, TFJobKind) for k in kinds)
        shared_objects(cluster, create=True)
        try:
            with kueue_with_tfjob(cluster) if tfjob else contextlib.nullcontext():
                for rep in range(args.reps):
                    for kind in kinds if rep % 2 == 0 else kinds[::-1]:  # ABBA
                        t = time.monotonic()
                        try:
                            figures = run_unit(cluster, kind, rep, args, logs)
                        except (AssertionError, RuntimeError, ApiException) as e:
                            text = str(e).strip().splitlines()[0][:70]
                            print(f"  rep {rep} {kind.name}: FAILED: {text}", file=sys.stderr)
                            figures = {f"{s}_error": text for s in args.scenario_list}
                        for key, value in figures.items():
                            results.setdefault(kind.name, {}).setdefault(key, []).append(value)
                        print(f"  rep {rep} {kind.name} done in {time.monotonic() - t:.0f}s",
                              file=sys.stderr, flush=True)
        finally:
            shared_objects(cluster, create=False)
            print(f"\nKueue admission, medians over {args.reps} rep(s) "
                  f"({datetime.datetime.now():%Y-%m-%d %H:%M}, nproc {os.cpu_count()}, "
                  f"{time.monotonic() - started:.0f}s; 2 workers x 100m CPU, quota 300m; "
                  f"polled every {args.interval}s)")
            print(table(results, names, unavailable))


if __name__ == "__main__":
    main()
