"""Thin kopf wiring: kopf runs the process (signals, login, the liveness endpoint); the
controller (controller/) does the watching, queueing and reconciling.

kopf's own resource watches are not used: the controller's informers keep caches that stay
correct across `410 Gone` (informer.py says why), and its Lease-based leader election covers
every mode (leader.py). No kopf handler is registered on jobs or pods, so kopf puts no
finalizer or annotation on them: deleting a job or its namespace never hangs on the operator.
"""

from __future__ import annotations

from typing import Any

import kopf

from multiworker.controller import Controller

registry = kopf.OperatorRegistry()


def operator_settings() -> kopf.OperatorSettings:
    """kopf as a process runner: no scanning of CRDs or namespaces, no peering, no kopf
    Events."""
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.enabled = False
    settings.peering.standalone = True
    return settings


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """$KUBECONFIG (or ~/.kube/config), else the in-cluster service account."""
    return kopf.login_via_client(**kwargs)


@kopf.on.startup(registry=registry)
async def start(memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    await controller.start()


@kopf.on.cleanup(registry=registry)
async def stop(memo: Any, **_: Any) -> None:
    controller: Controller = memo.controller
    await controller.stop()


@kopf.on.probe(id="controller", registry=registry)
def liveness(memo: Any, **_: Any) -> str:
    """Fails (HTTP 500 on /healthz) when a pass or an informer is stuck, so the kubelet
    restarts the operator instead of leaving jobs unwatched."""
    controller: Controller = memo.controller
    problem = controller.stuck()
    if problem is not None:
        raise kopf.PermanentError(problem)
    return "ok"
