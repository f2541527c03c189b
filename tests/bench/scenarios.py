"""The side-by-side scenarios. Each runs one repetition for one operator in a fresh namespace
(a Unit), starting and stopping the operator itself, and returns its figures by row label.

"Running" is always both: every pod of the job Running per the API (and none left of what had
to be replaced), and the job's own status saying so (contenders.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench.contenders import CONTAINER, Contender, Running
from tests.bench.harness import Cluster, Obj, cpu_seconds, rss_bytes
from tests.bench.identity import ApiServerCounts, scrape_sum
from tests.bench.mirror import Mirror, State

Figures = dict[str, float | str]


@dataclass
class Unit:
    cluster: Cluster  # admin: the harness's own reads and writes
    contender: Contender
    namespace: str
    env: dict[str, str]  # the operator's: KUBECONFIG of its own user
    logs: Path
    spec: Obj  # the shared pod template's spec
    timeout: float
    mirror: Mirror = field(init=False)
    starts: int = 0

    @contextlib.contextmanager
    def operator(self) -> Iterator[Running]:
        self.starts += 1
        log = self.logs / f"{self.namespace}-{self.starts}.log"
        spawned = time.monotonic()
        with self.contender.start(self.cluster, self.env, self.namespace, log) as running:
            running.started = spawned
            yield running

    def apply(self, name: str, workers: int) -> None:
        c = self.contender
        self.cluster.custom.create_namespaced_custom_object(
            c.group, c.version, self.namespace, c.plural, c.manifest(name, workers, self.spec))

    def wait(self, done: Callable[[State], bool], what: str, timeout: float | None = None,
             pods: int = 0) -> float:
        every = 0.02 if pods <= 1000 else 0.5  # `done` walks every pod
        return self.mirror.wait(done, timeout or self.timeout, f"{self.namespace}: {what}",
                                every)

    def job_running(self, name: str, workers: int, since: Obj | None = None,
                    replaced: frozenset[str] = frozenset()) -> Callable[[State], bool]:
        def done(s: State) -> bool:
            job, pods = s.jobs.get(name), s.job_pods(name)
            return (job is not None and len(pods) == workers and all(p.running for p in pods)
                    and not replaced & {p.uid for p in pods}
                    and self.contender.running(job, workers, since))
        return done

    def fail_pod(self, name: str) -> None:
        """Report the pod's container exited 137 (killed), as a kubelet would. kwok leaves the
        pod alone after that: its pod-ready stage only matches pods without an IP."""
        raw: Any = self.cluster.core.read_namespaced_pod(name, self.namespace,
                                                         _preload_content=False)
        pod = json.loads(raw.data)
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        started = pod["status"].get("startTime", now)
        conds = [dict(c, status="False", lastTransitionTime=now)
                 if c["type"] in ("Ready", "ContainersReady") else c
                 for c in pod["status"].get("conditions") or []]
        status = {"phase": "Failed", "conditions": conds, "containerStatuses": [{
            "name": CONTAINER, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
            "ready": False, "started": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                     "finishedAt": now}}}]}
        self.cluster.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": status},
            _content_type="application/merge-patch+json")


def start_and_fail(unit: Unit, workers: int, how: str) -> Figures:
    """apply -> all Running; then one worker fails (`how`: fail = exits 137, delete = pod
    deleted) -> all Running again, or the job failed."""
    out: Figures = {}
    with unit.operator():
        t0 = time.monotonic()
        unit.apply("job", workers)
        out["start"] = unit.wait(unit.job_running("job", workers), f"{workers} Running",
                                 pods=workers) - t0
        if how == "none":
            return out
        with unit.mirror.locked() as s:
            job = s.jobs["job"]
            pods = sorted(s.job_pods("job"), key=lambda p: p.name)
        victim = pods[len(pods) // 2]
        replaced = frozenset(p.uid for p in pods) if unit.contender.replaces_group else \
            frozenset({victim.uid})
        recovered = unit.job_running("job", workers, job, replaced)
        t1 = time.monotonic()
        if how == "fail":
            unit.fail_pod(victim.name)
        else:
            unit.cluster.core.delete_namespaced_pod(victim.name, unit.namespace)

        def settled(s: State) -> bool:
            j = s.jobs.get("job")
            return recovered(s) or (j is not None and unit.contender.failed(j))

        t2 = unit.wait(settled, f"{workers} Running again or the job Failed", pods=workers)
        with unit.mirror.locked() as s:
            failed = unit.contender.failed(s.jobs["job"]) and not recovered(s)
        out[how] = "job Failed" if failed else t2 - t1
        if failed:
            out[f"{how}_failed"] = t2 - t1
    return out


def all_jobs_running(unit: Unit, workers: int, names: list[str]) -> Callable[[State], bool]:
    def done(s: State) -> bool:
        by_job = s.pods_by_job()
        return len(by_job) >= len(names) and all(
            n in s.jobs and len(by_job[n]) == workers and all(p.running for p in by_job[n])
            and unit.contender.running(s.jobs[n], workers, None) for n in names)
    return done


def measure_window(unit: Unit, running: Running, seconds: float) -> Figures:
    """The operator's own API requests (counted by the API server per user, and by itself where
    it can), the API server's whole request rate, CPU and RSS, over `seconds` while the
    harness sends nothing."""
    pid, c = running.proc.pid, unit.contender
    a0, s0, cpu0, t0 = (ApiServerCounts.read(unit.cluster),
                        scrape_sum(running.metrics_port, c.request_metrics),
                        cpu_seconds(pid), time.monotonic())
    time.sleep(seconds)
    a1, s1, cpu1, t1 = (ApiServerCounts.read(unit.cluster),
                        scrape_sum(running.metrics_port, c.request_metrics),
                        cpu_seconds(pid), time.monotonic())
    dt = t1 - t0
    return {
        "req_user": (a1.of(c.name) - a0.of(c.name)) / dt,
        "req_self": "-" if s0 is None or s1 is None else (s1 - s0) / dt,
        "req_total": (a1.total - a0.total) / dt,
        "cpu": 100 * (cpu1 - cpu0) / dt,
        "rss": rss_bytes(pid) / 2**20,
    }


def baseline_rate(unit: Unit, seconds: float) -> float:
    """The API server's request rate with the same objects in place and no operator running
    (kubelet, kwok's heartbeats, controllers): taken right after the operator stops, since
    before it the previous unit's clean-up may still be echoing."""
    a0, t0 = ApiServerCounts.read(unit.cluster), time.monotonic()
    time.sleep(seconds)
    a1, t1 = ApiServerCounts.read(unit.cluster), time.monotonic()
    return (a1.total - a0.total) / (t1 - t0)


def steady(unit: Unit, jobs: int, workers: int, settle: float, window: float,
           base_seconds: float, canaries: int = 0, restart_limit: float = 60) -> Figures:
    """`jobs` x `workers`: apply all -> all Running; then the steady figures; with `canaries`,
    an operator restart too (restart_check)."""
    names = [f"job-{i:04d}" for i in range(jobs)]
    out: Figures = {}
    with unit.operator() as running:
        t0 = time.monotonic()
        for name in names:
            unit.apply(name, workers)
        out["all_running"] = unit.wait(all_jobs_running(unit, workers, names),
                                       f"{jobs}x{workers} Running", pods=jobs * workers) - t0
        time.sleep(settle)
        out.update(measure_window(unit, running, window))
    time.sleep(3)  # its last requests answered
    out["baseline"] = base = baseline_rate(unit, base_seconds)
    total = out.pop("req_total")
    assert isinstance(total, float)
    out["req_apiserver"] = total - base
    if canaries:
        out.update(restart_check(unit, names, workers, canaries, restart_limit))
    return out


def restart_check(unit: Unit, names: list[str], workers: int, canaries: int,
                  limit: float) -> Figures:
    """With the operator stopped, one worker of each of `canaries` jobs (spread over all) fails;
    then a new operator process starts. Every canary must be Running again (its failure
    handled) within `limit` seconds of the start, and no pod of any other job may be created or
    deleted: what the new process did to the jobs it merely re-read."""
    picked = names[:: max(1, len(names) // canaries)][:canaries]
    with unit.mirror.locked() as s:
        before = {n: s.jobs[n] for n in picked}
        pods = {n: sorted(s.job_pods(n), key=lambda p: p.name) for n in picked}
        canary_uids = {s.jobs[n]["metadata"]["uid"] for n in picked}
    replaced = {n: frozenset(p.uid for p in ps) if unit.contender.replaces_group
                else frozenset({ps[len(ps) // 2].uid}) for n, ps in pods.items()}
    for ps in pods.values():
        unit.fail_pod(ps[len(ps) // 2].name)
    checks = [unit.job_running(n, workers, before[n], replaced[n]) for n in picked]
    out: Figures = {}
    with unit.operator() as running:
        t0 = running.started  # the new process spawned
        try:
            out["restart_back"] = unit.wait(lambda s: all(c(s) for c in checks),
                                            f"{canaries} canaries Running again", limit,
                                            pods=len(names) * workers) - t0
        except AssertionError:
            out["restart_back"] = f">{limit:.0f}s"
        time.sleep(max(0.0, t0 + limit - time.monotonic()))
        with unit.mirror.locked() as s:
            wrong = [(kind, p.name) for t, kind, p in s.history
                     if t >= t0 and p.owner not in canary_uids]
            not_running = sum(1 for n, ps in s.pods_by_job().items() if n not in picked and (
                len(ps) != workers or not all(p.running for p in ps)))
    out["restart_wrong"] = float(len(wrong))
    out["restart_not_running"] = float(not_running)
    return out
