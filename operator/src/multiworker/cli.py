"""`multiworker-operator`: parse the command line, set up logs and metrics, run kopf."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import random
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from multiworker import handlers, logs, metrics
from multiworker.k8s import Cluster, new_api_client
from multiworker.peering import Peering, peering_namespaces

MAX_PRIORITY = 2**31 - 1

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
    parser.add_argument("--priority", type=int, metavar="N",
                        help="kopf peering priority: the live replica with the highest one "
                        "handles jobs (default with --peering: random, distinct per replica)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port (off when unset)")
    parser.add_argument("--health-port", type=int, metavar="PORT",
                        help="serve kopf's liveness endpoint /healthz on this port")
    parser.add_argument("--default-gang-scheduling", action="store_true",
                        help="gang-schedule jobs that leave spec.gang.enabled unset (needs the "
                        "coscheduling scheduler and the PodGroup CRD)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default="info")
    args = parser.parse_args(argv)
    if args.priority is not None and not args.peering:
        parser.error("--priority needs --peering")
    return args


def own_identity(environ: Mapping[str, str]) -> str:
    """kopf's peering identity: $POD_ID (the chart sets the pod name), else one of our own."""
    if environ.get("POD_ID"):
        return environ["POD_ID"]
    now = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    return f"{getpass.getuser()}@{socket.gethostname()}/{now}/{os.getpid()}"


def peering_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Peering | None:
    """Our place among HA replicas. kopf pauses *every* replica when two share the highest
    priority, so unless told otherwise each process draws its own."""
    if not args.peering:
        return None
    priority = args.priority if args.priority is not None else random.randint(1, MAX_PRIORITY)
    return Peering(name=args.peering, clusterwide=args.all_namespaces,
                   namespaces=peering_namespaces(args.namespace or ()),
                   identity=own_identity(environ), priority=priority)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    cluster = Cluster(new_api_client())
    loops = handlers.JobLoops(cluster)
    peering = peering_of(args, os.environ)
    scope = "all namespaces" if args.all_namespaces else ", ".join(args.namespace)
    log.info("starting: watching %s%s", scope, f"; peering {peering.name} as {peering.identity} "
             f"with priority {peering.priority}" if peering else "")
    kopf.run(
        registry=handlers.registry,
        settings=handlers.operator_settings(),
        memo=kopf.Memo(loops=loops, cluster=cluster, peering=peering),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=args.standalone or None,
        peering_name=args.peering,
        priority=peering.priority if peering else None,
        identity=cast(Any, peering.identity if peering else None),  # kopf's NewType of str
        liveness_endpoint=(
            f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
        ),
    )


if __name__ == "__main__":
    main()
