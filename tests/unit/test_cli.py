from __future__ import annotations

import pytest
from multiworker.cli import parse_args, peering_of


def test_namespaces_repeat() -> None:
    args = parse_args(["--namespace", "a", "--namespace=b", "--standalone"])
    assert args.namespace == ["a", "b"] and not args.all_namespaces and args.standalone
    assert (args.log_format, args.log_level, args.metrics_port) == ("text", "info", None)


def test_all_namespaces_with_ports_and_json_logs() -> None:
    args = parse_args(["--all-namespaces", "--metrics-port", "8080", "--health-port=8081",
                       "--log-format", "json", "--log-level", "debug", "--peering", "mwo"])
    assert args.all_namespaces and args.namespace is None
    assert (args.metrics_port, args.health_port, args.peering) == (8080, 8081, "mwo")


@pytest.mark.parametrize("argv", [
    [],  # a scope is required
    ["-n", "a", "--all-namespaces"],
    ["-A", "--standalone", "--peering", "x"],
    ["-A", "--log-format", "xml"],
])
def test_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_peering_draws_a_distinct_priority_per_process_unless_given() -> None:
    args = parse_args(["-n", "a", "-n", "team-*", "--peering", "mwo"])
    first, second = peering_of(args, {"POD_ID": "op-1"}), peering_of(args, {"POD_ID": "op-2"})
    assert first is not None and second is not None
    assert first.priority != second.priority and first.priority > 0
    assert (first.identity, first.name, first.namespaces, first.clusterwide) == (
        "op-1", "mwo", ("a",), False)
    fixed = peering_of(parse_args(["-A", "--peering", "mwo", "--priority", "7"]), {})
    assert fixed is not None and fixed.priority == 7 and fixed.locations == (None,)
    assert fixed.identity  # generated when $POD_ID is unset
    assert peering_of(parse_args(["-A", "--standalone"]), {}) is None


def test_priority_needs_peering() -> None:
    with pytest.raises(SystemExit):
        parse_args(["-A", "--priority", "5"])
