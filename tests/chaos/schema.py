"""The MultiWorkerJob CRD's OpenAPI schema (crds/) as a JSON Schema hypothesis-jsonschema can
generate from, with the pod template constrained.

OpenAPI → JSON Schema: `nullable` becomes a null type, OpenAPI 3.0's boolean
`exclusiveMinimum` a number, `x-kubernetes-list-type: set` `uniqueItems`,
`x-kubernetes-int-or-string` an anyOf, and an object that does not preserve unknown fields
gets `additionalProperties: false` (the API server refuses unknown fields with
fieldValidation=Strict). Descriptions, defaults and formats go (int32/int64 become bounds).

The template: spec.template may be a full core/v1 PodTemplateSpec (hundreds of KB of schema).
Generating from all of it would mostly test Kubernetes' own pod validation and make every
example huge, so only the parts the operator reads or sets are kept (TEMPLATE_KEEP) — with
names and images drawn from small patterns so most pods can really be created — and whatever
else the CRD declares there is left out. What is kept is still taken from the CRD: a field
the CRD does not declare is not generated.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Schema = dict[str, Any]

# Tree of what is kept of spec.template (arrays: their items), with extra constraints.
TEMPLATE_KEEP: Schema = {
    "metadata": {"labels": {}, "annotations": {}},
    "spec": {
        "containers": {"name": {}, "image": {}, "args": {}, "imagePullPolicy": {},
                       "env": {"name": {}, "value": {}}},
        "restartPolicy": {}, "hostname": {}, "subdomain": {},
        "terminationGracePeriodSeconds": {}, "priorityClassName": {},
    },
}
LABEL_KEY = r"^([a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?\.)?([a-z]{1,3}/)?[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?$"
CONSTRAINTS: dict[str, Schema] = {  # by path under spec.template; merged into the CRD's
    "spec.containers": {"maxItems": 2},
    "spec.containers.name": {"pattern": r"^(tensorflow|[a-z]([-a-z0-9]{0,6}[a-z0-9])?)$"},
    "spec.containers.image": {"pattern": r"^(multiworker\.local/base:bookworm|[a-z]{1,8}(:[a-z0-9]{1,4})?)$"},
    "spec.containers.args": {"maxItems": 3, "items": {"maxLength": 10}},
    "spec.containers.env": {"maxItems": 3},
    "spec.containers.env.name": {"pattern": r"^[A-Z_][A-Z0-9_]{0,8}$"},
    "spec.containers.env.value": {"maxLength": 10},
    "metadata.labels": {"maxProperties": 3, "propertyNames": {"pattern": LABEL_KEY},
                        "additionalProperties": {"type": "string", "maxLength": 12}},
    "metadata.annotations": {"maxProperties": 2, "propertyNames": {"maxLength": 20},
                             "additionalProperties": {"type": "string", "maxLength": 20}},
    "spec.hostname": {"maxLength": 10},
    "spec.subdomain": {"maxLength": 10},
    "spec.priorityClassName": {"maxLength": 10},
}
_INT_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_DROP = {"description", "default", "format", "example", "externalDocs"}


def crd_schema(crd_dir: Path) -> Schema:
    """The openAPIV3Schema of the MultiWorkerJob CRD's served version."""
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd.get("spec", {}).get("names", {}).get("kind") == "MultiWorkerJob":
            version = next(v for v in crd["spec"]["versions"] if v.get("served"))
            found: Schema = version["schema"]["openAPIV3Schema"]
            return found
    raise AssertionError(f"no MultiWorkerJob CRD in {crd_dir}")


def keep(schema: Schema, tree: Schema, constraints: dict[str, Schema], prefix: str = "") -> Schema:
    """`schema` cut down to `tree` (descending into array items), constraints merged in."""
    out = {k: v for k, v in schema.items() if k not in ("properties", "items", "required")}
    out.update(constraints.get(prefix.rstrip("."), {}))
    if schema.get("type") == "array" and "items" in schema:
        item_extra = constraints.get(prefix.rstrip("."), {}).get("items", {})
        items = keep(schema["items"], tree, constraints, prefix) if tree else \
            dict(schema["items"])
        out["items"] = {**items, **item_extra}
        return out
    props = schema.get("properties", {})
    if tree and props:
        out["properties"] = {name: keep(props[name], sub, constraints, f"{prefix}{name}.")
                             for name, sub in tree.items() if name in props}
        out["required"] = [r for r in schema.get("required", []) if r in out["properties"]]
    elif props:
        out["properties"] = props
        out["required"] = schema.get("required", [])
    if not out.get("required"):
        out.pop("required", None)
    return out


def to_json_schema(node: Any, closed: bool = True) -> Any:
    """OpenAPI v3 (Kubernetes structural) → JSON Schema draft 7. `closed`: no unknown fields
    even where the CRD preserves them, and integers within int64 (for generating); else
    exactly the CRD's constraints (for breaking them)."""
    if isinstance(node, list):
        return [to_json_schema(n, closed) for n in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP or key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {k: to_json_schema(v, closed) for k, v in value.items()}
        else:
            out[key] = to_json_schema(value, closed)
    if closed and node.get("type") == "integer":
        low, high = _INT_BOUNDS.get(node.get("format", ""), _INT_BOUNDS["int64"])
        out.setdefault("minimum", low)
        out.setdefault("maximum", high)
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if node.get("x-kubernetes-int-or-string"):
        out = {k: v for k, v in out.items() if k != "type"}
        out["anyOf"] = [{"type": "integer"}, {"type": "string", "maxLength": 10}]
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if node.get("type") == "object" and "additionalProperties" not in node and (
            closed or not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if node.get("nullable"):
        out.pop("nullable", None)
        if "type" in out:
            out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    return out


def spec_schema(openapi: Schema, closed: bool = True) -> Schema:
    """The JSON Schema of jobs' `spec`, template cut down to TEMPLATE_KEEP: `closed` (with
    CONSTRAINTS) to generate from, open (the CRD's constraints only) to break."""
    spec = copy.deepcopy(openapi["properties"]["spec"])
    template = spec["properties"]["template"]
    spec["properties"]["template"] = keep(template, TEMPLATE_KEEP,
                                          CONSTRAINTS if closed else {})
    converted: Schema = to_json_schema(spec, closed)
    converted["$schema"] = "http://json-schema.org/draft-07/schema#"
    return converted


def list_maps(openapi: Schema, path: str = "") -> dict[str, list[str]]:
    """Paths (dotted, arrays as []) of list-type=map arrays, with their keys."""
    found: dict[str, list[str]] = {}
    if openapi.get("x-kubernetes-list-type") == "map":
        found[path] = list(openapi.get("x-kubernetes-list-map-keys", []))
    for name, sub in (openapi.get("properties") or {}).items():
        found.update(list_maps(sub, f"{path}.{name}" if path else name))
    if isinstance(openapi.get("items"), dict):
        found.update(list_maps(openapi["items"], f"{path}[]"))
    return found
