from __future__ import annotations

import pytest
from multiworker.cli import parse_args


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
