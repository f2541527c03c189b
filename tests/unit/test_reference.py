"""docs/reference.md is rendered from the CRD (api/reference.py): every field of spec and status
is on it with its default and bounds, and the committed page is what the generator writes."""

from __future__ import annotations

from typing import Any

import pytest
from multiworker.api import crd, reference

from tests.cluster import REPO


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    root: dict[str, Any] = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


@pytest.fixture(scope="module")
def page() -> str:
    return reference.render_reference(crd.render_crd())


def fields(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every field below node but spec.template's (Kubernetes' own), with its dotted path."""
    out = []
    target = node.get("items", node) if node.get("type") == "array" else node
    for name, child in target.get("properties", {}).items():
        child_path = f"{path}.{name}"
        out.append((child_path, child))
        if child_path != "spec.template":
            out += fields(child, child_path + ("[]" if child.get("type") == "array" else ""))
    return out


def test_the_committed_page_is_the_generators_output(page: str) -> None:
    assert (REPO / "docs/reference.md").read_text() == page, "run make generate"


def test_every_field_is_listed_in_its_parents_section(schema: dict[str, Any], page: str) -> None:
    for part in ("spec", "status"):
        for path, node in fields(schema["properties"][part], part):
            parent, name = path.rsplit(".", 1)
            section = page.split(f"### `{parent}`", 1)[1].split("\n### ", 1)[0]
            line = next((ln for ln in section.splitlines() if ln.startswith(f"- `{name}` — ")),
                        None)
            assert line, f"{path} is missing from the reference"
            if "default" in node:
                assert "default `" in line, f"{path}: no default"
            for bound in ("minimum", "maximum", "maxLength", "maxItems"):
                if bound in node:
                    assert str(node[bound]) in line, f"{path}: no {bound}"
            for value in node.get("enum", []):
                assert f"`{value}`" in line, f"{path}: no enum value {value}"


def test_constraints_read_as_words() -> None:
    assert reference._constraints({"minimum": 1, "maximum": 5}) == ["1 to 5"]
    assert reference._constraints({"minimum": 0, "exclusiveMinimum": True, "maximum": 1}) == [
        "greater than 0", "at most 1"]
    assert reference._constraints({"enum": ["A", "B"], "nullable": True}) == [
        "one of `A`, `B`", "may be null"]
    assert reference._text("a <b> `<c>` d*e") == "a &lt;b&gt; `<c>` d\\*e"
