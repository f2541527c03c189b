"""Warm in place, cold in place, recreate: SIGKILL one trainer of the CPU example, time until
the new generation trains (local real cluster, real TensorFlow pods; not part of CI).

    .venv/bin/python tests/bench/bench_in_place.py [--kills 5] [--workers 3] [--cluster kind]

Needs the local cluster (make cluster-up) with the worker image loaded (make images-load), or
with `--cluster kind` the kind cluster (make cluster-up images-load CLUSTER=kind: two worker
nodes; the workers are spread over both, the checkpoints on the directory every node mounts,
pod IPs reached through the host routes hack/kind/up.sh adds). Runs the real operator (on
this host) for a fresh namespace with a hostPath checkpoint claim. Per kill, in turn the
three paths (PATHS: mode InPlace with its warm standby, InPlace with warmStandby false, and
Recreate): applies examples/cpu-job.yaml (as
`--workers` workers, 200 epochs so it outlasts the measurement, backoffSeconds 0 so the
restart policy's wait is not counted), waits for its first checkpoint, SIGKILLs worker-1's
trainer (t = 0, when `kubectl exec kill` returned; warm: once every pod's spare is ready) and polls the API and every worker's
GET /progress every 50 ms:

- seen: the operator moved the job to the next generation;
- stopped: in place, the generation released in every pod (every old trainer stopped);
  recreate, every old pod gone;
- ready: every pod of the new generation has its trainer running (warm: its launcher reports
  the new generation's trainer running);
- step: a worker of the new generation reports a training step past the one it restored
  (the collective of the new group works: MultiWorkerMirroredStrategy steps together).

And, from worker-0's log of the new generation (kubectl logs --timestamps), where the
start-up between `ready` and `step` goes: `import` (until the runtime serves /progress:
Python, TensorFlow and Keras imported), `peers` (until every peer resolves and the preflight
passed), `strategy` (the collective formed), `restore` (the checkpoint restored, the first
steps traced and run, until `step`).

Prints one row per kill (with its start-up parts), then the median and max of each path and
their ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness import (
    GROUP,
    JOB_LABEL,
    PLURAL,
    REPO,
    VERSION,
    Cluster,
    Obj,
    operator,
)
from tests.cluster import KIND_ENV, read_env_file

POLL = 0.05
GENERATION = "multiworker.dev/group-generation"
RELEASED = "multiworker.dev/released-generation"
LAUNCHER = "multiworker.dev/launcher"
# SIGKILL worker-1's trainer: the one its launcher runs (not the spare, whose command line is the
# same), or, without a launcher, the process running the script.
KILL_TRAINER = ("r=/run/multiworker/launcher.json; if [ -f $r ]; then kill -KILL \"$(python3 -c "
                "\"import json; print(json.load(open('$r'))['trainerPid'])\")\"; "
                "else pkill -KILL -f 'digit[s].py'; fi")  # not this sh's own command line
# The three ways a group restarts, as spec.restartPolicy says them.
PATHS = {"warm": {"mode": "InPlace"}, "cold": {"mode": "InPlace", "warmStandby": False},
         "recreate": {"mode": "Recreate"}}
PHASES = ("seen", "stopped", "ready", "step")
# Worker log lines that end each part of a trainer's start-up (after `ready`).
STARTUP = (("import", "serving progress on"), ("peers", "preflight passed"),
           ("strategy", "strategy ready"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5, help="kills per path (default 5)")
    parser.add_argument("--workers", type=int, default=3, help="workers (default 3)")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--cluster", choices=("local", "kind"), default="local")
    return parser.parse_args(argv)


def job_manifest(name: str, workers: int, path: str, spread: bool = False) -> Obj:
    job: Obj = yaml.safe_load((REPO / "examples" / "cpu-job.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["workers"] = workers
    job["spec"]["restartPolicy"] |= {"backoffSeconds": 0, **PATHS[path]}
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["env"] = [{"name": "TRAIN_EPOCHS", "value": "200"}]
    trainer["resources"]["requests"] = {"cpu": "100m", "memory": "512Mi"}
    if spread:  # workers on every node (kind: two), not wherever the scheduler likes
        job["spec"]["template"]["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": {JOB_LABEL: name}}}]
    return job


def claim(cluster: Cluster, namespace: str, shared: str) -> None:
    volume = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": f"bench-{namespace}"[:63]},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                       # Retain: the hostPath deleter serves /tmp only (kind's is not); the
                       # bench deletes the volume itself.
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "claimRef": {"namespace": namespace, "name": "checkpoints"},
                       "hostPath": {"path": shared, "type": "DirectoryOrCreate"}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "checkpoints", "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                    "resources": {"requests": {"storage": "1Gi"}}}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [volume, pvc]}))


def pods(cluster: Cluster, namespace: str, job: str) -> list[Obj]:
    response: Any = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"{JOB_LABEL}={job}", _preload_content=False)
    return list(json.loads(response.data)["items"])


def status(cluster: Cluster, namespace: str, job: str) -> Obj:
    found: Any = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                              job)
    return dict(found.get("status") or {})


def progress(pod: Obj) -> Obj | None:
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:8471/progress", timeout=0.3) as answer:
            return dict(json.loads(answer.read()))
    except (OSError, ValueError):
        return None


def trainer_running(pod: Obj, generation: int) -> bool:
    """Its trainer of `generation` runs: the container, and where the warm launcher runs the
    trainer inside it, the launcher's report (the operator copies it onto the pod)."""
    container = any(c.get("name") == "tensorflow" and "running" in (c.get("state") or {})
                    for c in pod.get("status", {}).get("containerStatuses") or [])
    annotations = pod["metadata"].get("annotations") or {}
    if "multiworker.dev/warm-agent-port" not in annotations:
        return container
    report = json.loads(annotations.get(LAUNCHER) or "{}")
    return container and report.get("generation") == generation and \
        report.get("state") == "running"


@dataclass
class Kill:
    mode: str
    times: dict[str, float]
    uids_kept: bool
    nodes: int  # how many nodes the workers ran on


def one_kill(cluster: Cluster, namespace: str, workers: int, mode: str,
             timeout: float, spread: bool) -> Kill:
    name = f"k{uuid.uuid4().hex[:6]}"
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    stdin=json.dumps(job_manifest(name, workers, mode, spread)))
    deadline = time.monotonic() + timeout
    while not (status(cluster, namespace, name).get("progress") or {}).get("lastCheckpointStep"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: no checkpoint in {timeout}s")
        time.sleep(0.5)
    if mode == "warm":  # a spare starts 15 s after its trainer: the restart is warm once ready
        while len(spares_of(cluster, namespace, name, workers)) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no spares in {timeout}s")
            time.sleep(0.5)
    found = pods(cluster, namespace, name)
    before = {p["metadata"]["uid"] for p in found}
    nodes = len({p["spec"].get("nodeName") for p in found})
    cluster.kubectl("-n", namespace, "exec", f"{name}-worker-1", "-c", "tensorflow", "--",
                    "sh", "-c", KILL_TRAINER)
    t0, wall, times = time.monotonic(), time.time(), {}
    deadline = t0 + timeout
    while "step" not in times:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{name} ({mode}): only {sorted(times)} after {timeout}s")
        s = status(cluster, namespace, name)
        new = s.get("groupGeneration", 0)
        if new >= 1:
            times.setdefault("seen", now - t0)
        found = pods(cluster, namespace, name)
        current = [p for p in found if p["metadata"]["labels"].get(GENERATION) == str(new)]
        if new >= 1 and "stopped" not in times and (
                len(current) == len(found) == workers if mode == "recreate" else
                all(p["metadata"].get("annotations", {}).get(RELEASED) == str(new)
                    for p in found) and len(found) == workers):
            times["stopped"] = now - t0
        if "stopped" in times and "ready" not in times and len(current) == workers \
                and all(trainer_running(p, new) for p in current):
            times["ready"] = now - t0
        if "ready" in times:
            for pod in current:
                report = progress(pod) or {}
                if report.get("generation") == new and \
                        report.get("step", 0) > report.get("restoredFromStep", 0) > 0:
                    times["step"] = time.monotonic() - t0
                    break
        time.sleep(POLL)
    times |= startup(cluster, namespace, name, wall, times)
    after = {p["metadata"]["uid"] for p in pods(cluster, namespace, name)}
    cluster.kubectl("-n", namespace, "delete", "mwj", name, "--wait=true", "--timeout=120s",
                    check=False)
    return Kill(mode, times, after == before, nodes)


def spares_of(cluster: Cluster, namespace: str, job: str, workers: int) -> list[int]:
    """The host pids of the job's ready spares (local cluster: its containers share this
    kernel), as each pod's launcher names them (launcher.json, pids of the container's
    namespace: NSpid's last)."""
    found = []
    for index in range(workers):
        pod = f"{job}-worker-{index}"
        raw = cluster.kubectl("-n", namespace, "exec", pod, "-c", "tensorflow", "--", "cat",
                              "/run/multiworker/launcher.json", check=False)
        report = json.loads(raw) if raw.strip().startswith("{") else {}
        if report.get("spare") != "ready":
            continue
        for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
            try:
                environ = (pid / "environ").read_bytes().split(b"\0")
                ns_pids = next(line for line in (pid / "status").read_text().splitlines()
                               if line.startswith("NSpid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if f"HOSTNAME={pod}".encode() in environ and ns_pids[-1] == str(report["sparePid"]):
                found.append(int(pid.name))
    return found


def spare_cost(cluster: Cluster, namespace: str, workers: int, timeout: float,
               seconds: float = 30) -> None:
    """What a waiting spare costs: its resident memory, its CPU over `seconds` while the
    group trains, and whether it has touched a GPU (a CUDA library mapped, /dev/nvidia* open)."""
    name = f"s{uuid.uuid4().hex[:6]}"
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    stdin=json.dumps(job_manifest(name, workers, "warm")))
    deadline = time.monotonic() + timeout
    while len(spares := spares_of(cluster, namespace, name, workers)) < workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: {len(spares)} of {workers} spares after {timeout}s")
        time.sleep(1)

    def ticks(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    before = {pid: ticks(pid) for pid in spares}
    time.sleep(seconds)
    cpu = [(ticks(pid) - before[pid]) / os.sysconf("SC_CLK_TCK") / seconds for pid in spares]
    rss = [int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text()
                    .splitlines() if line.startswith("VmRSS:"))) / 1024 for pid in spares]
    gpu = [pid for pid in spares if "libcuda" in Path(f"/proc/{pid}/maps").read_text() or any(
        os.readlink(fd).startswith("/dev/nvidia") for fd in Path(f"/proc/{pid}/fd").iterdir())]
    cluster.kubectl("-n", namespace, "delete", "mwj", name, "--wait=false", check=False)
    print(f"\nwaiting spare, {len(spares)} pods: resident memory median "
          f"{statistics.median(rss):.0f} MiB (max {max(rss):.0f}); CPU while the group trains "
          f"median {100 * statistics.median(cpu):.2f}% of a core over {seconds:g}s; "
          f"touched a GPU (libcuda mapped or /dev/nvidia* open): {len(gpu)} of {len(spares)}")


def startup(cluster: Cluster, namespace: str, job: str, offset: float,
            times: dict[str, float]) -> dict[str, float]:
    """The parts of worker-0's start-up, as durations (see the module docstring)."""
    log = cluster.kubectl("-n", namespace, "logs", f"{job}-worker-0", "-c", "tensorflow",
                          "--timestamps", check=False)
    ends, start, parts = {}, times["ready"], {}
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        for part, marker in STARTUP:
            if marker in text and part not in ends:
                at = datetime.datetime.fromisoformat(stamp).timestamp() - offset
                if at > 0:  # the new generation's (warm: one log holds every generation's)
                    ends[part] = at
    for part, _ in STARTUP:
        if part in ends:
            parts[part] = ends[part] - start
            start = ends[part]
    parts["restore"] = times["step"] - start
    return parts


def main() -> None:
    args = parse_args()
    if args.cluster == "kind":
        env = read_env_file(KIND_ENV)
        cluster, shared_root = Cluster(Path(env["KUBECONFIG"])), env["MW_KIND_SHARED_DIR"]
    else:
        cluster, shared_root = Cluster(REPO / ".cluster" / "kubeconfig"), None
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.wait_established(f"{PLURAL}.{GROUP}")
    namespace = f"bench-inplace-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    # kind: the host directory every node mounts at the same path.
    shared = (f"{shared_root}/bench/{namespace}" if shared_root
              else tempfile.mkdtemp(prefix="mwj-bench-ckpt-"))
    claim(cluster, namespace, shared)
    log = Path(tempfile.mkdtemp(prefix="mwj-bench-")) / "operator.log"
    kills: list[Kill] = []
    try:
        with operator(cluster, namespace, log):
            for i in range(len(PATHS) * args.kills):
                kill = one_kill(cluster, namespace, args.workers, list(PATHS)[i % len(PATHS)],
                                args.timeout, spread=args.cluster == "kind")
                kills.append(kill)
                row = "  ".join(f"{p} {kill.times.get(p, float('nan')):6.2f}s" for p in PHASES)
                parts = " ".join(f"{p} {kill.times.get(p, float('nan')):.2f}"
                                 for p in (*(p for p, _ in STARTUP), "restore"))
                print(f"{kill.mode:9} {row}  same pods: {kill.uids_kept}  nodes: {kill.nodes}"
                      f"  ({parts})", flush=True)
            if args.cluster == "local":
                spare_cost(cluster, namespace, args.workers, args.timeout)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"bench-{namespace}"[:63], "--wait=false", check=False)
        print(f"operator log: {log}")
    parts = (*(p for p, _ in STARTUP), "restore")
    for mode in PATHS:
        cells = [f"{part} {statistics.median(k.times[part] for k in kills if k.mode == mode):.2f}"
                 for part in parts]
        print(f"{mode}: start-up between ready and step, medians (s): {', '.join(cells)}")
    print(f"\nSIGKILL of worker-1's trainer -> ..., {args.workers} workers on "
          f"{args.cluster}, {args.kills} kills per path (seconds)")
    print(f"{'path':9} " + "  ".join(f"{p + ' med':>10} {p + ' max':>9}" for p in PHASES))
    medians = {}
    for mode in PATHS:
        rows = [k.times for k in kills if k.mode == mode]
        cells = []
        for phase in PHASES:
            values = [r[phase] for r in rows]
            medians[(mode, phase)] = statistics.median(values)
            cells.append(f"{statistics.median(values):10.2f} {max(values):9.2f}")
        print(f"{mode:9} " + "  ".join(cells))
    kept = [k.uids_kept for k in kills if k.mode != "recreate"]
    print(f"in place kept every pod in {sum(kept)} of {len(kept)} restarts (the others fell "
          "back to recreation at the stop bound)")
    for mode in ("warm", "cold"):
        print(f"{mode} in place / recreate (medians): " + "  ".join(
            f"{p} {medians[(mode, p)] / medians[('recreate', p)]:.2f}" for p in PHASES))


if __name__ == "__main__":
    main()
