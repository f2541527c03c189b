"""Side by side: multiworker against Kubeflow training-operator (TFJob) on kwok fake nodes, in
one run, alternating operator by operator within each repetition (not part of CI).

    .venv/bin/python tests/bench/bench_side_by_side.py [--quick] [--scenarios start,fail,...]

Needs the local cluster (make cluster-up), kwok (hack/cluster/build-binaries.sh kwok) and the
TFJob operator (hack/bench/build-tfjob.sh; both builds under flock /tmp/mw-build.lock). Each
unit of work (one scenario, one repetition, one operator) holds the cluster lock
(/tmp/mw-cluster.lock; --no-lock when the caller holds it), gets a fresh namespace, starts
that operator as a host process watching only that namespace, measures, stops it, and deletes
what it made. Scenarios (sizes are flags):

- start: apply a job of --workers -> all its pods Running and its status Running;
- fail: then one worker's container exits 137 (its pod status set to Failed, as a kubelet
  would) -> all Running again: ours a whole new generation, TFJob (restartPolicy ExitCode)
  that one pod replaced;
- delete: a job of --delete-workers, one pod deleted -> Running again (ours: a new generation;
  TFJob fails the job instead, reported as such);
- steady: --steady JOBSxWORKERS all Running, then over --window seconds: the operator's own API
  requests/s (counted by the API server for its user; identity.py) and by its own client where
  it exports a counter, the API server's request rate above a baseline taken right after the
  operator stops (same objects, no operator), the operator's CPU % and RSS;
- scale: the same at --scale (default 1000x8), then an operator restart (scenarios.py
  restart_check): canary jobs failed while it was down must be Running again within 60 s, and
  no other pod created or deleted.

Prints one table: medians per operator and the ratio multiworker / TFJob.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import report
from tests.bench.contenders import CONTENDERS, Contender, Multiworker, pod_spec
from tests.bench.harness import CLUSTER_LOCK, REPO, Cluster, cluster_lock, wait_for
from tests.bench.identity import install, kubeconfig_for
from tests.bench.mirror import Mirror
from tests.bench.scenarios import Figures, Unit, start_and_fail, steady

SCENARIOS = ("start", "fail", "delete", "steady", "scale")


def size(text: str) -> tuple[int, int]:
    jobs, workers = text.lower().split("x")
    return int(jobs), int(workers)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default="start,fail,delete,steady,scale",
                   help=f"comma-separated, from {','.join(SCENARIOS)}")
    p.add_argument("--contenders", default="multiworker,tfjob")
    p.add_argument("--reps", type=int, default=3, help="repetitions per scenario (default 3)")
    p.add_argument("--scale-reps", type=int, default=1)
    p.add_argument("--workers", type=int, default=64, help="start and fail (default 64)")
    p.add_argument("--delete-workers", type=int, default=256)
    p.add_argument("--steady", type=size, default=(40, 8), metavar="JOBSxWORKERS")
    p.add_argument("--scale", type=size, default=(1000, 8), metavar="JOBSxWORKERS")
    p.add_argument("--window", type=float, default=60, help="steady window, seconds")
    p.add_argument("--settle", type=float, default=40,
                   help="wait after all Running, seconds (default 40: past the 30 s in which the "
                   "poller asks new groups every 2 s, a start-up cost, not a steady one)")
    p.add_argument("--baseline", type=float, default=30, help="baseline window, seconds")
    p.add_argument("--canaries", type=int, default=20, help="scale: jobs failed during restart")
    p.add_argument("--grace", type=int, default=1, help="terminationGracePeriodSeconds")
    p.add_argument("--backoff", type=int, default=0,
                   help="multiworker restartPolicy.backoffSeconds (TFJob has none)")
    p.add_argument("--gpus-per-node", type=int, default=100, help="fake nodes (<= 110 pods)")
    p.add_argument("--timeout", type=float, default=300, help="one wait, seconds")
    p.add_argument("--scale-timeout", type=float, default=2400)
    p.add_argument("--lock", default=CLUSTER_LOCK)
    p.add_argument("--no-lock", action="store_true", help="the caller holds the cluster lock")
    p.add_argument("--lock-per", choices=("unit", "scenario", "run"), default="scenario",
                   help="hold the cluster lock per unit (one rep of one operator), per "
                   "scenario (default: every rep of both) or for the whole run")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 rep, 16 workers, 32 to delete, steady 5x4, scale "
                   "20x8, 10 s windows")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.scale_reps, args.workers, args.delete_workers = 1, 1, 16, 32
        args.steady, args.scale, args.canaries = (5, 4), (20, 8), 4
        args.window, args.settle, args.baseline = 10, 3, 10
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    args.contender_list = [c for c in args.contenders.split(",") if c]
    unknown = set(args.scenario_list) - set(SCENARIOS) | set(args.contender_list) - set(
        CONTENDERS)
    if unknown or args.reps < 1:
        p.error(f"unknown: {', '.join(sorted(unknown))}" if unknown else "--reps at least 1")
    return args


def held(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    return cluster_lock(args.lock, hold=not args.no_lock)


def pods_needed(args: argparse.Namespace) -> int:
    sizes = {"start": args.workers, "fail": args.workers, "delete": args.delete_workers,
             "steady": math.prod(args.steady), "scale": math.prod(args.scale)}
    return int(max(sizes[s] for s in args.scenario_list))


def ensure_cluster(cluster: Cluster, args: argparse.Namespace, contenders: list[Contender]
                   ) -> None:
    """The cluster up (up.sh repairs a broken one), fake nodes (kwok) for the largest scenario,
    the CRDs and the operators' identities; cheap when already in place (another user of the
    cluster may have changed them since our last hold of the lock)."""
    cluster.run(REPO / "hack/cluster/up.sh")
    nodes = math.ceil(pods_needed(args) / args.gpus_per_node) + 1
    cluster.run(REPO / "hack/cluster/fake-nodes.sh", str(nodes), str(args.gpus_per_node))
    for c in contenders:
        c.install(cluster)
    install(cluster, [c.name for c in contenders])


@contextlib.contextmanager
def deletion_may_time_out() -> Iterator[None]:
    """8,000 pods outlast the API server's 60 s request timeout (504): the deletion goes on,
    and the namespace's deletion finishes whatever it left."""
    try:
        yield
    except ApiException as e:
        if e.status != 504:
            raise


def teardown(cluster: Cluster, c: Contender, ns: str) -> None:
    """Everything in `ns`, at once (the operator is stopped): finalizers dropped, pods deleted
    with no grace (kwok would otherwise remove them one by one), then the namespace."""
    listed: Any = cluster.custom.list_namespaced_custom_object(c.group, c.version, ns, c.plural)
    for job in listed["items"]:
        if job["metadata"].get("finalizers"):
            cluster.custom.patch_namespaced_custom_object(
                c.group, c.version, ns, c.plural, job["metadata"]["name"],
                {"metadata": {"finalizers": None}})
    with deletion_may_time_out():
        cluster.custom.delete_collection_namespaced_custom_object(c.group, c.version, ns, c.plural)
    with deletion_may_time_out():
        cluster.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    with deletion_may_time_out():
        cluster.core.delete_collection_namespaced_service(ns)
    cluster.core.delete_namespace(ns)

    def gone() -> bool:
        try:
            cluster.core.read_namespace(ns)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(gone, 900, 0.5, f"namespace {ns} deleted")  # the next unit starts quiet


def run_unit(cluster: Cluster, args: argparse.Namespace, c: Contender, scenario: str,
             logs: Path) -> Figures:
    ns = f"bench-{scenario}-{c.name[:5]}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    env = dict(cluster.env, KUBECONFIG=str(kubeconfig_for(c.name, cluster.kubeconfig)))
    big = scenario == "scale"
    unit = Unit(cluster, c, ns, env, logs, pod_spec(args.grace),
                args.scale_timeout if big else args.timeout)
    try:
        c.prepare(cluster, ns)
        unit.mirror = Mirror(cluster, ns, c.api)
        try:
            if scenario in ("start", "fail", "delete"):
                workers = args.delete_workers if scenario == "delete" else args.workers
                return start_and_fail(unit, workers, "none" if scenario == "start" else scenario)
            jobs, workers = args.scale if big else args.steady
            return steady(unit, jobs, workers, args.settle, args.window, args.baseline,
                          canaries=args.canaries if big else 0)
        finally:
            unit.mirror.close()
    finally:
        try:
            teardown(cluster, c, ns)
        except (AssertionError, ApiException) as e:  # the figures above still stand
            print(f"  teardown of {ns} failed: {str(e).splitlines()[0]}", file=sys.stderr)


def run_scenario(cluster: Cluster, args: argparse.Namespace, contenders: list[Contender],
                 scenario: str, logs: Path, results: report.Results) -> None:
    reps = args.scale_reps if scenario == "scale" else args.reps
    for rep in range(reps):
        order = contenders if rep % 2 == 0 else contenders[::-1]  # ABBA: no drift
        for c in order:
            t = time.monotonic()
            with held(args) if args.lock_per == "unit" else contextlib.nullcontext():
                try:
                    ensure_cluster(cluster, args, contenders)
                    figures = run_unit(cluster, args, c, scenario, logs)
                except (AssertionError, RuntimeError, ApiException) as e:
                    print(f"  {scenario} rep {rep} {c.name}: FAILED: {e}", file=sys.stderr)
                    figures = {"error": str(e).strip().splitlines()[0][:60]}
            results.add(scenario, c.name, figures)
            print(f"  {scenario} rep {rep} {c.name} ({time.monotonic() - t:.0f}s): "
                  f"{report.brief(figures)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cluster = Cluster(Path(os.environ.get("KUBECONFIG", REPO / ".cluster/kubeconfig")))
    contenders = [CONTENDERS[n] for n in args.contender_list]
    contenders = [replace(c, backoff_seconds=args.backoff) if isinstance(c, Multiworker) else c
                  for c in contenders]
    logs = Path(tempfile.mkdtemp(prefix="mw-side-by-side-"))
    results = report.Results()
    print(f"operator logs in {logs}", file=sys.stderr)
    holds = ([args.scenario_list] if args.lock_per == "run"
             else [[s] for s in args.scenario_list])
    try:
        for i, scenarios in enumerate(holds):
            with held(args) if args.lock_per != "unit" else contextlib.nullcontext():
                for scenario in scenarios:
                    run_scenario(cluster, args, contenders, scenario, logs, results)
                if i == len(holds) - 1:  # still holding the lock: no fake nodes left behind
                    with (held(args) if args.lock_per == "unit"
                          else contextlib.nullcontext()), contextlib.suppress(RuntimeError):
                        cluster.run(REPO / "hack/cluster/fake-nodes.sh", "--delete")
    finally:
        print(report.table(results, args, [c.name for c in contenders]))

if __name__ == "__main__":
    main()
