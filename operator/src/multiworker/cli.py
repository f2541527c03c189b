"""`multiworker-operator`: parse the command line, set up logs and metrics, run kopf."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import kopf

from multiworker import handlers, logs, metrics
from multiworker.k8s import Cluster, new_api_client

log = logging.getLogger(__name__)


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
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true",
                         help="run without kopf peering (a single operator replica)")
    peering.add_argument("--peering", metavar="NAME",
                         help="kopf peering object shared by operator replicas (HA)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port (off when unset)")
    parser.add_argument("--health-port", type=int, metavar="PORT",
                        help="serve kopf's liveness endpoint /healthz on this port")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default="info")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    loops = handlers.JobLoops(Cluster(new_api_client()))
    scope = "all namespaces" if args.all_namespaces else ", ".join(args.namespace)
    log.info("starting: watching %s", scope)
    kopf.run(
        registry=handlers.registry,
        settings=handlers.operator_settings(),
        memo=kopf.Memo(loops=loops),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=args.standalone or None,
        peering_name=args.peering,
        liveness_endpoint=(
            f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
        ),
    )


if __name__ == "__main__":
    main()
