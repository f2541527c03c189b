"""`multiworker-operator`: parse the command line, set up logs and metrics, run kopf."""

from __future__ import annotations

import argparse
import gc
import getpass
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import kopf
import uvloop

from multiworker import handlers, logs
from multiworker.api import names
from multiworker.clients import metrics
from multiworker.clients.kube import Cluster
from multiworker.clients.transport import ClientSettings, Transport, new_api_client
from multiworker.controller import Controller
from multiworker.reconcile.context import Options

log = logging.getLogger(__name__)
_DEFAULTS = ClientSettings()
# The cycle collector's thresholds (generation 0, 1, 2); Python's are (700, 10, 10). The
# operator allocates a few dicts per watch event and keeps thousands of pods cached, few of
# them in cycles: with the defaults, a bench_scale.py run (8, 64, 256 workers) spent 0.16 s
# of its 5.5 s of CPU in 280 collections, with these 0.003 s in one.
GC_THRESHOLDS = (20_000, 20, 20)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="multiworker-operator",
        description="Run the MultiWorkerJob operator against $KUBECONFIG or the in-cluster "
        "service account.",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", action="append", metavar="NS",
                       help="handle jobs in this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true",
                       help="handle jobs in every namespace")
    parser.add_argument("--standalone", action="store_true",
                        help="development only: skip leader election and act on every job "
                        "even while another operator instance handles it")
    parser.add_argument("--identity", metavar="ID",
                        help="this instance's name in leader-election Leases (default: "
                        "$POD_NAME, else user@host/pid)")
    parser.add_argument("--kube-api-qps", type=float, default=_DEFAULTS.qps, metavar="QPS",
                        help=f"sustained API requests per second (default {_DEFAULTS.qps:g})")
    parser.add_argument("--kube-api-burst", type=int, default=_DEFAULTS.burst, metavar="N",
                        help=f"API requests allowed in a burst (default {_DEFAULTS.burst})")
    parser.add_argument("--request-timeout", type=float, default=_DEFAULTS.timeout_seconds,
                        metavar="SECONDS",
                        help=f"timeout of every API call (default {_DEFAULTS.timeout_seconds:g})")
    parser.add_argument("--api-concurrency", type=int, default=_DEFAULTS.concurrency,
                        metavar="N", help="pod creates/deletes in flight at once "
                        f"(default {_DEFAULTS.concurrency})")
    parser.add_argument("--workers", type=int, default=8, metavar="N",
                        help="reconcile passes at once (default 8)")
    parser.add_argument("--progress-status-seconds", type=float, default=10.0,
                        metavar="SECONDS", help="without hang detection, how often workers' "
                        "progress is polled into status.progress (default 10)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port (off when unset)")
    parser.add_argument("--health-port", type=int, metavar="PORT",
                        help="serve the liveness endpoint /healthz on this port")
    parser.add_argument("--default-gang-scheduling", action="store_true",
                        help="gang-schedule jobs that leave spec.gang.enabled unset (needs the "
                        "coscheduling scheduler and the PodGroup CRD)")
    parser.add_argument("--kueue", action="store_true",
                        help="jobs labelled kueue.x-k8s.io/queue-name wait for Kueue to admit "
                        "them (Kueue v0.17+ with MultiWorkerJob.v1alpha1.multiworker.dev among "
                        "its integrations.externalFrameworks)")
    parser.add_argument("--worker-network-policy", action="store_true",
                        help="give every job a NetworkPolicy that admits only its own workers "
                        "and, on the progress port, this operator's pods (needs a network "
                        "plugin that enforces NetworkPolicy)")
    parser.add_argument("--operator-namespace", metavar="NS",
                        help="where this operator's pods run, for --worker-network-policy "
                        "(default: $POD_NAMESPACE, which the chart sets)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default="info")
    return parser.parse_args(argv)


def options_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Options:
    """What passes need of the command line; a NetworkPolicy without the operator's own
    namespace would shut the operator out of /progress, so that is an error here."""
    policy_namespace = None
    if args.worker_network_policy:
        policy_namespace = args.operator_namespace or environ.get("POD_NAMESPACE")
        if not policy_namespace:
            raise SystemExit("--worker-network-policy needs --operator-namespace (or "
                             "$POD_NAMESPACE): the policy admits the operator's pods there")
    return Options(gang_default=args.default_gang_scheduling,
                   policy_operator_namespace=policy_namespace, kueue=args.kueue)


def own_identity(environ: Mapping[str, str]) -> str:
    """This instance's leader-election identity: $POD_NAME (the chart sets it), else one that
    names the user, host, start time and process."""
    if environ.get("POD_NAME"):
        return environ["POD_NAME"]
    now = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    return f"{getpass.getuser()}@{socket.gethostname()}/{now}/{os.getpid()}"


def tune_gc() -> None:
    """Fewer cycle collections, none over what start-up made: the modules, classes and
    functions (~70,000 objects) live as long as the process, so every full collection
    walked them for nothing (operator CPU per pod at 256 workers: 2.31 -> 2.10 ms,
    bench_scale.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    settings = ClientSettings(qps=args.kube_api_qps, burst=args.kube_api_burst,
                              timeout_seconds=args.request_timeout,
                              concurrency=args.api_concurrency)
    identity = None if args.standalone else (args.identity or own_identity(os.environ))
    api = new_api_client(pool_size=max(64, settings.concurrency * 2))
    cluster = Cluster(Transport(api, settings), instance=identity)
    controller = Controller(cluster, None if args.all_namespaces else args.namespace,
                            identity, workers=args.workers,
                            progress_status_seconds=args.progress_status_seconds,
                            options=options_of(args, os.environ))
    scope = "all namespaces" if args.all_namespaces else ", ".join(args.namespace)
    if identity is None:
        log.warning("--standalone: NO LEADER ELECTION. This instance acts on every job in %s "
                    "even while another operator instance handles it; the two will fight "
                    "over pods and status. Use it only where no other instance runs.", scope)
    log.info("starting: watching %s%s", scope,
             f"; leader election as {identity} (Lease {names.LEASE_NAME} in each namespace "
             "with jobs)" if identity else "")
    tune_gc()
    kopf.run(
        registry=handlers.registry,
        settings=handlers.operator_settings(),
        memo=kopf.Memo(controller=controller),
        loop=uvloop.new_event_loop(),  # transport.py says why
        clusterwide=True,
        standalone=True,
        liveness_endpoint=(
            f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
        ),
    )


if __name__ == "__main__":
    main()
