from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from multiworker.cli import GC_THRESHOLDS, options_of, own_identity, parse_args, tune_gc


def test_namespaces_repeat() -> None:
    args = parse_args(["--namespace", "a", "--namespace=b", "--standalone"])
    assert args.namespace == ["a", "b"] and not args.all_namespaces and args.standalone
    assert (args.log_format, args.log_level, args.metrics_port) == ("text", "info", None)


def test_all_namespaces_with_ports_limits_and_json_logs() -> None:
    args = parse_args(["--all-namespaces", "--metrics-port", "8080", "--health-port=8081",
                       "--log-format", "json", "--log-level", "debug", "--kube-api-qps", "20",
                       "--kube-api-burst", "40", "--request-timeout", "10", "--workers", "4"])
    assert args.all_namespaces and args.namespace is None and not args.standalone
    assert (args.metrics_port, args.health_port) == (8080, 8081)
    assert (args.kube_api_qps, args.kube_api_burst, args.request_timeout, args.workers) == (
        20, 40, 10, 4)


def test_defaults_protect_the_api_server() -> None:
    args = parse_args(["-A"])
    assert (args.kube_api_qps, args.kube_api_burst, args.request_timeout) == (500, 1000, 30)


@pytest.mark.parametrize("argv", [
    [],  # a scope is required
    ["-n", "a", "--all-namespaces"],
    ["-A", "--log-format", "xml"],
    ["-A", "--peering", "x"],  # kopf peering is gone: Leases replace it
])
def test_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_identity_is_the_pod_name_or_names_user_host_and_process() -> None:
    assert own_identity({"POD_NAME": "op-1"}) == "op-1"
    generated = own_identity({})
    assert "@" in generated and generated.count("/") == 2


def test_a_worker_network_policy_needs_the_operators_namespace() -> None:
    args = parse_args(["-A", "--worker-network-policy"])
    assert options_of(args, {"POD_NAMESPACE": "ops"}).policy_operator_namespace == "ops"
    chosen = parse_args(["-A", "--worker-network-policy", "--operator-namespace", "mine"])
    assert options_of(chosen, {"POD_NAMESPACE": "ops"}).policy_operator_namespace == "mine"
    assert options_of(parse_args(["-A"]), {}).policy_operator_namespace is None
    with pytest.raises(SystemExit, match="--worker-network-policy needs --operator-namespace"):
        options_of(args, {})


@pytest.fixture
def gc_restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_start_up_objects_are_frozen_out_of_cycle_collections(gc_restored: None) -> None:
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 10_000  # the modules, classes and functions loaded so far
    assert len(gc.get_objects()) < gc.get_freeze_count()
