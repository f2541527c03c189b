"""The spec generator and its oracle, without a cluster: what they produce is what the generated
specs case (test_generated_specs.py) relies on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.chaos.breakage import Breakage, breakages
from tests.chaos.generate import MAX_RUNNING_WORKERS, Case, Generator
from tests.chaos.oracle import (
    RULES,
    apply_defaults,
    names,
    unknown_rules,
    use_schema,
    violations,
)
from tests.chaos.schema import crd_schema
from tests.cluster import REPO

OPENAPI = crd_schema(REPO / "crds")
use_schema(OPENAPI)
GENERATOR = Generator(OPENAPI)


@seed(3)
@settings(max_examples=60, database=None, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(case=GENERATOR.cases())
def test_cases_are_cheap_and_the_valid_ones_break_no_known_rule(case: Case) -> None:
    spec = case.job["spec"]
    if not isinstance(spec, dict):
        assert case.broken == "object of the wrong type at spec"
        return
    if case.treatment == "valid":
        assert case.expected == () and violations(case.job) == []
    else:
        assert case.expected, case
    if case.treatment != "structural" or "suspend" not in case.broken:
        if case.running and isinstance(spec.get("workers"), int):
            assert spec["workers"] <= MAX_RUNNING_WORKERS or "workers" in case.broken
        elif not case.running:
            assert spec.get("suspend") is True or "suspend" in case.broken


def test_every_crd_rule_is_known() -> None:
    assert unknown_rules(OPENAPI) == []


def test_breakages_name_the_field_as_the_api_server_does() -> None:
    spec: dict[str, Any] = {
        "workers": 2, "template": {"spec": {"containers": [{"name": "a", "image": "b"}]}},
        "restartPolicy": {"onExitCodes": [{"action": "FailJob", "values": [2, 3]}]},
    }
    found = {b.path: b for b in breakages(GENERATOR.open, spec, ("spec",))}
    assert "spec.restartPolicy.onExitCodes[0].values[2]" in found  # a duplicate in the set
    assert found["spec.restartPolicy.onExitCodes[0].values[1]"].what in (
        "integer of the wrong type", "below the minimum", "above the maximum")
    assert "spec.chaosUnknownField" in found
    job = {"metadata": {"name": "x"}, "spec": spec}
    Breakage("a required field dropped", ("spec", "workers"), drop=True).apply(job)
    assert "workers" not in job["spec"]


def test_rules_see_the_schema_defaults() -> None:
    job = {"metadata": {"name": "train"}, "spec": {"workers": 1, "port": 8471,
                                                   "template": {"spec": {}}}}
    defaulted = apply_defaults(OPENAPI, job)
    assert defaulted["spec"]["health"]["progressPort"] == 8471
    assert violations(job) == ["spec.health.progressPort"]
    for rule in RULES:
        rule.repair(job)
    assert violations(job) == []


SSA_MISSING_KEY = (".spec.template.spec.containers: element 1: associative list with keys has an "
                   'element that omits all key fields ["name"]')


@pytest.mark.parametrize(("message", "path", "named"), [
    ('spec.workers: Invalid value: 0: should be greater than or equal to 1', "spec.workers",
     True),
    ("spec.template.spec.containers[1].image: Required value",
     "spec.template.spec.containers[1].image", True),
    ('spec.template.spec.containers[name="x"].image: Required value',
     "spec.template.spec.containers[0].image", True),
    (SSA_MISSING_KEY, "spec.template.spec.containers[1].name", True),
    (SSA_MISSING_KEY, "spec.template.spec.containers[2].name", False),
    (SSA_MISSING_KEY, "spec.template.spec.containers[1].image", False),
    ("spec.suspend: Invalid value", "spec.workers", False),
    (".spec.restartPolicy.onExitCodes[7].values: duplicate entries for key [=120]",
     "spec.restartPolicy.onExitCodes[7].values[11]", True),
    (".spec.restartPolicy.onExitCodes[7].values: duplicate entries for key [=120]",
     "spec.restartPolicy.onExitCodes[6].codes[11]", False),
    ((".spec.template.spec.containers[name=\"tensorflow\"].env: element 0: associative list "
     "with keys may not have non-map elements"), "spec.template.spec.containers[0].env[0]", True),
    ((".spec.template.spec.containers[name=\"tensorflow\"].env: element 0: associative list "
     "with keys may not have non-map elements"), "spec.template.spec.containers[0].env[1]", False),
    (('.spec.template.spec.containers[name="tensorflow"].env: element 0: associative list with '
     'keys has an element that omits all key fields ["name"]'),
     "spec.template.spec.containers[0].env[0].name", True),
])
def test_a_refusal_names_the_field_in_any_notation_the_api_server_uses(
    message: str, path: str, named: bool
) -> None:
    assert names(message, path) is named
