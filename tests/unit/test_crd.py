from __future__ import annotations

from pathlib import Path
from typing import Any

from multiworker import crd

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / "multiworker.dev_multiworkerjobs.yaml"


def test_committed_crd_is_generated_from_the_models() -> None:
    assert COMMITTED.read_text() == crd.render_yaml(), (
        "crds/ is stale: run `python -m multiworker.crd > crds/multiworker.dev_multiworkerjobs.yaml`"
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


def test_schema_is_structural() -> None:
    text = crd.render_yaml()
    for forbidden in ("$ref", "anyOf", "title:", "$defs", "&id"):
        assert forbidden not in text


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
