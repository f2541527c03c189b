from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from multiworker.api import crd

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / "multiworker.dev_multiworkerjobs.yaml"


def test_committed_crd_is_generated_from_the_models() -> None:
    assert COMMITTED.read_text() == crd.render_yaml(), (
        "crds/ is stale: run `python -m multiworker.api.crd > crds/multiworker.dev_multiworkerjobs.yaml`"
    )


def properties(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, prop in schema.get("properties", {}).items():
        found.append((f"{path}.{name}", prop))
        found += properties(prop, f"{path}.{name}")
    if "items" in schema:
        found += properties(schema["items"], f"{path}[]")
    return found


def test_kubectl_explain_describes_every_spec_and_status_field() -> None:
    schema = crd.open_api_schema()
    for section in ("spec", "status"):
        undocumented = [
            path for path, prop in properties(schema["properties"][section], section)
            if not prop.get("description")
        ]
        assert not undocumented


def nodes(schema: Any) -> list[dict[str, Any]]:
    """Every schema node: the node itself and everything under properties, items, etc."""
    found = [schema]
    for prop in schema.get("properties", {}).values():
        found += nodes(prop)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += nodes(schema[key])
    return found


def test_schema_is_structural() -> None:
    text = crd.render_yaml()
    for forbidden in ("$ref", "allOf", "oneOf", "title:", "$defs", "&id", "patch-strategy"):
        assert forbidden not in text
    for node in nodes(crd.open_api_schema()):
        if "anyOf" in node:  # only int-or-string may use it, and only this way
            assert node["x-kubernetes-int-or-string"] is True
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
            assert "type" not in node
        else:
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), node


def template_schema() -> dict[str, Any]:
    result: dict[str, Any] = crd.open_api_schema()["properties"]["spec"]["properties"]["template"]
    return result


def test_template_is_kubernetes_pod_template_spec_all_the_way_down() -> None:
    template = template_schema()
    assert "x-kubernetes-preserve-unknown-fields" not in template
    container = template["properties"]["spec"]["properties"]["containers"]["items"]
    resources = container["properties"]["resources"]
    assert resources["description"].startswith("Compute Resources required by this container")
    assert set(resources["properties"]) >= {"limits", "requests", "claims"}
    assert "limit" not in resources["properties"]
    limit = resources["properties"]["limits"]["additionalProperties"]
    assert limit["x-kubernetes-int-or-string"] is True
    ports = container["properties"]["ports"]
    assert ports["x-kubernetes-list-type"] == "map"
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"


def test_template_keeps_the_operator_rules_on_top_of_kubernetes_schema() -> None:
    template = template_schema()
    assert template["required"] == ["spec"]
    pod = template["properties"]["spec"]
    rules = [v["rule"] for v in pod["x-kubernetes-validations"]]
    assert "!has(self.hostname) && !has(self.subdomain)" in rules
    assert "'Never'" in rules[0]
    assert pod["properties"]["containers"]["minItems"] == 1
    assert pod["required"] == ["containers"]
    container = pod["properties"]["containers"]["items"]
    assert container["required"] == ["name", "image"]
    assert container["properties"]["image"]["minLength"] == 1
    metadata = template["properties"]["metadata"]
    assert "multiworker.dev/" in metadata["x-kubernetes-validations"][0]["rule"]
    assert "creationTimestamp" in metadata["properties"]  # the whole ObjectMeta


def test_overlay_refuses_a_field_kubernetes_does_not_have() -> None:
    kubernetes = {"type": "object", "properties": {"hostname": {"type": "string"}}}
    operator = {"properties": {"hostName": {"description": "typo"}}}
    with pytest.raises(ValueError, match=r"spec.template: \['hostName'\]"):
        crd.overlay(kubernetes, operator, "spec.template")


def test_structural_conversion() -> None:
    defs = {"Inner": {"type": "object", "title": "Inner", "additionalProperties": True,
                      "description": "An\n  inner   object."}}
    schema = {
        "type": "object",
        "properties": {
            "ratio": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
                      "default": None, "title": "Ratio"},
            "inner": {"$ref": "#/$defs/Inner", "description": "Field wins."},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "mode": {"const": "Never", "type": "string"},
        },
    }
    assert crd.structural(schema, defs) == {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "nullable": True, "minimum": 0, "exclusiveMinimum": True},
            "inner": {"description": "Field wins.", "type": "object",
                      "x-kubernetes-preserve-unknown-fields": True},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "mode": {"type": "string", "enum": ["Never"]},
        },
    }


def test_printer_columns_and_status_subresource() -> None:
    version = crd.render_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Ready"] == ".status.ready"
    assert columns["Restarts"] == ".status.restarts"
    assert columns["Step"] == ".status.progress.step"
    assert columns["Age"] == ".metadata.creationTimestamp"
