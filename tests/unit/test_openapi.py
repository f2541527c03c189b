"""Kubernetes' OpenAPI v3 → structural CRD schema (multiworker.api.openapi), on small documents
shaped like api__v1_openapi.json, and on the committed excerpt."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from multiworker.api import openapi

from tests.cluster import REPO

Q = "io.k8s.apimachinery.pkg.api.resource.Quantity"
SCHEMAS: dict[str, Any] = {
    Q: {"description": "Quantity is a fixed-point number.",
        "oneOf": [{"type": "string"}, {"type": "number"}]},
    "Port": {
        "type": "object",
        "required": ["containerPort"],
        "properties": {
            "containerPort": {"type": "integer", "format": "int32", "default": 0},
            "protocol": {"type": "string", "default": "TCP", "description": "Protocol."},
        },
    },
    "Raw": {"type": "object", "description": "Anything."},
    "Container": {
        "type": "object",
        "description": "A container.",
        "x-kubernetes-unions": [{"fields-to-discriminateBy": {"a": "A"}}],
        "properties": {
            "name": {"type": "string", "default": ""},
            "limits": {"type": "object",
                       "additionalProperties": {"allOf": [{"$ref": f"#/components/schemas/{Q}"}]}},
            "ports": {
                "type": "array",
                "items": {"allOf": [{"$ref": "#/components/schemas/Port"}], "default": {}},
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                "x-kubernetes-patch-merge-key": "containerPort",
                "x-kubernetes-patch-strategy": "merge",
            },
            "raw": {"allOf": [{"$ref": "#/components/schemas/Raw"}],
                    "description": "The field's own words."},
        },
    },
}


def convert(name: str) -> dict[str, Any]:
    return openapi.structural({"$ref": f"#/components/schemas/{name}"}, SCHEMAS, name)


def test_references_inlined_markers_kept_merge_and_union_hints_dropped() -> None:
    container = convert("Container")
    assert container["description"] == "A container."
    assert "x-kubernetes-unions" not in container
    ports = container["properties"]["ports"]
    assert ports["x-kubernetes-list-type"] == "map"
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    assert not any(k.startswith("x-kubernetes-patch") for k in ports)
    # The field's description wins over the referenced type's.
    assert container["properties"]["raw"]["description"] == "The field's own words."


def test_defaults_dropped_except_on_list_map_keys_that_are_not_required() -> None:
    container = convert("Container")
    assert "default" not in container["properties"]["name"]
    port = container["properties"]["ports"]["items"]
    assert "default" not in port
    assert port["properties"]["protocol"]["default"] == "TCP"
    assert "default" not in port["properties"]["containerPort"]  # required instead


def test_quantity_is_int_or_string_and_an_empty_object_keeps_its_content() -> None:
    container = convert("Container")
    assert container["properties"]["limits"]["additionalProperties"] == {
        "description": "Quantity is a fixed-point number.",
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    }
    assert container["properties"]["raw"]["x-kubernetes-preserve-unknown-fields"] is True


def test_an_unknown_keyword_fails_the_conversion_naming_where() -> None:
    schemas = {"X": {"type": "object", "properties": {"f": {"type": "string", "not": {}}}}}
    with pytest.raises(ValueError, match=r"X\.f: 'not'"):
        openapi.structural({"$ref": "#/components/schemas/X"}, schemas, "X")


def test_a_list_map_key_without_default_or_required_fails() -> None:
    schemas = {"L": {"type": "array", "x-kubernetes-list-type": "map",
                     "x-kubernetes-list-map-keys": ["k"],
                     "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}
    with pytest.raises(ValueError, match="neither required nor defaulted"):
        openapi.structural({"$ref": "#/components/schemas/L"}, schemas, "L")


def test_extract_keeps_exactly_what_the_root_reaches_verbatim() -> None:
    schemas = {
        openapi.ROOT: {"properties": {"spec": {"allOf": [{"$ref": "#/components/schemas/A"}]}}},
        "A": {"properties": {"b": {"items": {"$ref": "#/components/schemas/B"}}}},
        "B": {"type": "string"},
        "Unused": {"type": "string"},
    }
    document = json.dumps({"components": {"schemas": schemas}}).encode()
    excerpt = openapi.extract(document, "v9.9.9")
    assert excerpt["schemas"] == {k: v for k, v in schemas.items() if k != "Unused"}
    assert excerpt["source"] == {"module": "k8s.io/kubernetes@v9.9.9", "path": openapi.SOURCE_PATH,
                                 "sha256": hashlib.sha256(document).hexdigest()}


def test_the_committed_excerpt_is_the_pinned_kubernetes() -> None:
    excerpt = openapi.packaged()
    env = (REPO / "hack" / "cluster" / "versions.env").read_text().splitlines()
    versions = dict(line.split("=", 1) for line in env if line and not line.startswith("#"))
    assert excerpt["source"]["module"] == f"k8s.io/kubernetes@{versions['K8S_VERSION']}"
    assert excerpt["root"] == "io.k8s.api.core.v1.PodTemplateSpec"
    assert "io.k8s.api.core.v1.PodSpec" in excerpt["schemas"]

