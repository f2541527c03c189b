"""Kubernetes' own OpenAPI v3 schemas turned into structural CRD schemas (for spec.template).

The source is `api/openapi-spec/v3/api__v1_openapi.json` of the k8s.io/kubernetes Go module at
the pinned version. `extract` copies the schemas PodTemplateSpec reaches, verbatim, into
`podtemplatespec.openapi.json` (package data, committed: rendering the CRD needs no Go);
`structural` converts them, so the CRD types every field of the template the way the API
server types a Pod, and `kubectl explain` shows Kubernetes' own docs:

- `$ref` and `allOf: [{$ref}]` are inlined; the referring field's description wins;
- IntOrString and Quantity (`oneOf`) become `x-kubernetes-int-or-string` (integer or string);
- an object without properties (FieldsV1) keeps whatever it holds;
- list and map markers (`x-kubernetes-list-type`, `-list-map-keys`, `-map-type`) are kept;
  strategic-merge and union markers are dropped (CRDs have neither);
- `default`s are dropped (the API server defaults the pods it creates), except on a list-map
  key that is not required, where a CRD must have one;
- any other keyword fails the conversion, so a new Kubernetes construct is never lost quietly.

    python -m multiworker.api.openapi extract API_V1_OPENAPI_JSON MODULE_VERSION > OUT
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

Schema = dict[str, Any]

ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
SOURCE_PATH = "api/openapi-spec/v3/api__v1_openapi.json"
PACKAGED = "podtemplatespec.openapi.json"

INT_OR_STRING: Schema = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
}
# Named types whose OpenAPI v3 form is a oneOf of scalars, which a structural schema cannot say.
_INT_OR_STRING_TYPES = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
}
_KEPT = {
    "description", "type", "format", "required", "enum", "pattern", "minimum", "maximum",
    "minItems", "maxItems", "minLength", "maxLength", "maxProperties",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
}
_DROPPED = {"default", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key",
            "x-kubernetes-unions", "$ref", "allOf"}


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _target(node: Schema, path: str) -> str | None:
    """The schema a node refers to: `$ref`, or `allOf` with exactly one `$ref` (OpenAPI v3's
    way of putting a description next to a reference)."""
    if "$ref" in node:
        return _ref_name(node["$ref"])
    if "allOf" in node:
        refs = node["allOf"]
        if len(refs) != 1 or set(refs[0]) != {"$ref"}:
            raise ValueError(f"{path}: allOf other than one $ref: {refs}")
        return _ref_name(refs[0]["$ref"])
    return None


def structural(node: Schema, schemas: Schema, path: str = "") -> Schema:
    """Convert one OpenAPI v3 node (and everything under it) to a structural CRD schema."""
    name = _target(node, path)
    if name is not None:
        siblings = {k: v for k, v in node.items() if k not in ("$ref", "allOf")}
        if name in _INT_OR_STRING_TYPES:
            description = siblings.get("description", schemas[name].get("description"))
            return {"description": description, **INT_OR_STRING} if description else {
                **INT_OR_STRING}
        return structural({**schemas[name], **siblings}, schemas, path)
    out: Schema = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {prop: structural(sub, schemas, f"{path}.{prop}")
                        for prop, sub in value.items()}
        elif key == "items":
            out[key] = _items(node, schemas, path)
        elif key == "additionalProperties":
            out[key] = structural(value, schemas, f"{path}.*")
        elif key in _KEPT:
            out[key] = value
        elif key not in _DROPPED:
            raise ValueError(f"{path or '.'}: {key!r} has no place in a CRD schema")
    if out.get("type") == "object" and not {"properties", "additionalProperties"} & set(out):
        out["x-kubernetes-preserve-unknown-fields"] = True  # FieldsV1: any JSON object
    return out


def _items(node: Schema, schemas: Schema, path: str) -> Schema:
    """A list's item schema; the keys of a list-map keep their defaults (a CRD needs them)."""
    keys = set(node.get("x-kubernetes-list-map-keys", ()))
    items = structural(node["items"], schemas, f"{path}[]")
    if not keys:
        return items
    resolved = node["items"]
    name = _target(resolved, path)
    if name is not None:
        resolved = schemas[name]
    for key in sorted(keys - set(items.get("required", ()))):
        source = resolved.get("properties", {}).get(key, {})
        if "default" not in source:
            raise ValueError(f"{path}: list-map key {key!r} is neither required nor defaulted")
        items["properties"][key]["default"] = source["default"]
    return items


def closure(schemas: Schema, root: str) -> list[str]:
    """The names of every schema `root` reaches, itself included, sorted."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [_ref_name(ref) for ref in _refs(schemas[name])]
    return sorted(seen)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def extract(document: bytes, module_version: str) -> Schema:
    """The part of api__v1_openapi.json that PodTemplateSpec needs, verbatim, with its origin."""
    schemas = json.loads(document)["components"]["schemas"]
    return {
        "source": {
            "module": f"k8s.io/kubernetes@{module_version}",
            "path": SOURCE_PATH,
            "sha256": hashlib.sha256(document).hexdigest(),
        },
        "root": ROOT,
        "schemas": {name: schemas[name] for name in closure(schemas, ROOT)},
    }


def packaged() -> Schema:
    """The committed excerpt (`make generate` refreshes it)."""
    text = resources.files(__package__).joinpath(PACKAGED).read_text()
    result: Schema = json.loads(text)
    return result


def pod_template_schema() -> Schema:
    """spec.template's CRD schema: the pinned Kubernetes' PodTemplateSpec, structural."""
    excerpt = packaged()
    return structural({"$ref": excerpt["root"]}, excerpt["schemas"], "template")


def main(argv: list[str]) -> None:
    if len(argv) != 4 or argv[1] != "extract":
        raise SystemExit(__doc__)
    excerpt = extract(Path(argv[2]).read_bytes(), argv[3])
    sys.stdout.write(json.dumps(excerpt, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv)
