"""Building blocks of the API models: the model bases, CEL rules and the time format.

Field docstrings become CRD descriptions (`kubectl explain`); `cel(...)` rules become
`x-kubernetes-validations`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer
from pydantic.alias_generators import to_camel


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC; milliseconds only when there are any (recovery times need them)."""
    value = value.astimezone(UTC)
    if value.microsecond == 0:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


Time = Annotated[datetime, PlainSerializer(format_time, return_type=str, when_used="json")]


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message always names the field."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        frozen=True,
    )


class OpenModel(Model):
    """Part of a core/v1 object: the fields we check are typed, everything else is kept."""

    model_config = ConfigDict(extra="allow")
