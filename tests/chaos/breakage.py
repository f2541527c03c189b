"""Structural breakages of a job, derived from the CRD's own schema (schema.spec_schema with
closed=False: exactly the CRD's constraints) at each field the job has. Each names the field
the API server's refusal must name, in its own notation (`a.b[0].c`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.chaos.schema import Schema

Obj = dict[str, Any]
Key = str | int
UNKNOWN = "chaosUnknownField"


@dataclass(frozen=True)
class Breakage:
    what: str
    keys: tuple[Key, ...]  # where, from the job's root
    value: Any = None
    drop: bool = False

    @property
    def path(self) -> str:
        out = ""
        for key in self.keys:
            out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
        return out

    def apply(self, job: Obj) -> None:
        *parents, last = self.keys
        node: Any = job
        for key in parents:
            node = node[key]
        if self.drop:
            del node[last]
        elif isinstance(node, list) and last == len(node):
            node.append(self.value)
        else:
            node[last] = self.value


def _types(schema: Schema) -> set[str]:
    found = schema.get("type")
    if isinstance(found, list):
        return set(found)
    return {found} if found else set()


def breakages(schema: Schema, value: Any, keys: tuple[Key, ...]) -> Iterator[Breakage]:
    """Every way to break `value` (at `keys`) against `schema` alone."""
    types = _types(schema)
    if value is None:
        return
    wrong = {"integer": "chaos", "number": "chaos", "string": 7, "boolean": "chaos",
             "object": "chaos", "array": "chaos"}
    main = next(iter(types - {"null"}), None)
    if main in wrong:
        yield Breakage(f"{main} of the wrong type", keys, wrong[main])
    if main in ("integer", "number"):
        yield from _numbers(schema, keys, main)
    elif main == "string":
        if "enum" in schema:
            yield Breakage("a value outside the enum", keys, "ChaosValue")
        if schema.get("minLength", 0) >= 1:
            yield Breakage("shorter than minLength", keys, "")
        if "maxLength" in schema:
            yield Breakage("longer than maxLength", keys, "x" * (schema["maxLength"] + 1))
    elif main == "object" and isinstance(value, dict):
        yield from _object(schema, value, keys)
    elif main == "array" and isinstance(value, list):
        yield from _array(schema, value, keys)


def _numbers(schema: Schema, keys: tuple[Key, ...], main: str) -> Iterator[Breakage]:
    step = 1 if main == "integer" else 0.5
    if "minimum" in schema:
        yield Breakage("below the minimum", keys, schema["minimum"] - step)
    if "exclusiveMinimum" in schema:
        yield Breakage("at the exclusive minimum", keys, schema["exclusiveMinimum"])
    if "maximum" in schema:
        yield Breakage("above the maximum", keys, schema["maximum"] + step)


def _object(schema: Schema, value: Obj, keys: tuple[Key, ...]) -> Iterator[Breakage]:
    props = schema.get("properties") or {}
    if schema.get("additionalProperties") is False:
        yield Breakage("an unknown field", (*keys, UNKNOWN), 1)
    for name in schema.get("required", []):
        if name in value:
            yield Breakage("a required field dropped", (*keys, name), drop=True)
    for name, sub in props.items():
        if name in value:
            yield from breakages(sub, value[name], (*keys, name))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, item in value.items():
            if name not in props:
                yield from breakages(extra, item, (*keys, name))


def _array(schema: Schema, value: list[Any], keys: tuple[Key, ...]) -> Iterator[Breakage]:
    if schema.get("minItems", 0) >= 1:
        yield Breakage("fewer items than minItems", keys, [])
    if schema.get("uniqueItems") and value:
        yield Breakage("a duplicate in a set", (*keys, len(value)), value[0])
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            yield from breakages(items, item, (*keys, i))
