"""Pure: Kubernetes resource quantities ("1", "1.0", "500m", "2k", "2Gi") as numbers, parsed the
way the API server parses them, by the Kubernetes client's own parser rather than ours.
The one module of decide/ allowed to import the kubernetes package (its `utils.quantity`
only: no client, no I/O), an exception written into the import contracts."""

from __future__ import annotations

from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity


def parse(value: str | int | float) -> Decimal:
    """The quantity as a number; ValueError names a malformed one."""
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from e


def parse_or_zero(value: str | int | float) -> Decimal:
    """For figures that only inform (who holds what): a malformed quantity counts as 0."""
    try:
        return parse(value)
    except ValueError:
        return Decimal(0)
