"""Generated MultiWorkerJobs: the spec from the CRD's schema (hypothesis-jsonschema over
schema.spec_schema), then one of three treatments, drawn evenly by hypothesis:

- valid: every CEL rule the oracle knows repaired — the API server must accept it;
- rule: valid, then one CEL rule broken (oracle.BREAKABLE);
- structural: valid, then one structural breakage (breakage.py) at a field the job has.

Accepted jobs must stay cheap for the operator: half are forced `suspend: true` (any worker
count: the operator only writes Suspended), the other half run at most 4 workers pinned to the
kwok fake nodes (pods that cost the API server only). Nulls are not generated: in a
server-side apply configuration a null says "this field is not mine", which is not what the
schema's `nullable` is about.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from tests.chaos.breakage import Breakage, breakages
from tests.chaos.kwok import KWOK_PLACEMENT
from tests.chaos.oracle import BREAKABLE, repair, violations
from tests.chaos.schema import Schema, spec_schema

Obj = dict[str, Any]
TREATMENTS = ("valid", "rule", "structural")
MAX_RUNNING_WORKERS = 4
# GPU requests in forms the API server accepts as quantities: whole ("1.0", "2k") ones must
# start a group, fractional ones fail the job with a named reason (never a pass that raises).
GPU_QUANTITIES = (None, 1, "1", "1.0", "2k", "0.5", "1500m")


@dataclass(frozen=True)
class Case:
    job: Obj
    treatment: str
    running: bool
    expected: tuple[str, ...] = ()  # fields a refusal must name; () = must be accepted
    broken: str = ""  # what was broken


@dataclass
class Generator:
    openapi: Schema  # the CRD's openAPIV3Schema
    closed: Schema = field(init=False)
    open: Schema = field(init=False)
    serial: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.closed = spec_schema(self.openapi, closed=True)
        self.open = spec_schema(self.openapi, closed=False)
        self.list_maps = _list_map_keys(self.openapi["properties"]["spec"])

    def cases(self) -> st.SearchStrategy[Case]:
        return _cases(self)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value if v is not None]
    return value


def _list_map_keys(schema: Schema, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    found = {}
    if schema.get("x-kubernetes-list-type") == "map":
        found[path] = list(schema.get("x-kubernetes-list-map-keys", []))
    for name, sub in (schema.get("properties") or {}).items():
        found.update(_list_map_keys(sub, (*path, name)))
    if isinstance(schema.get("items"), dict):
        found.update(_list_map_keys(schema["items"], (*path, "[]")))
    return found


def _dedupe(value: Any, maps: dict[tuple[str, ...], list[str]], path: tuple[str, ...] = ()
            ) -> Any:
    """Items of list-type=map arrays made unique by their keys (the schema cannot say it)."""
    if isinstance(value, dict):
        return {k: _dedupe(v, maps, (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        items = [_dedupe(v, maps, (*path, "[]")) for v in value]
        if path in maps:
            seen, unique = set(), []
            for item in items:
                key = tuple(str(item.get(k)) for k in maps[path]) if isinstance(item, dict) \
                    else (str(item),)
                if key not in seen:
                    seen.add(key)
                    unique.append(item)
            items = unique
        return items
    return value


def _place(job: Obj, running: bool) -> None:
    spec = job["spec"]
    if not running:
        spec["suspend"] = True
        return
    spec["suspend"] = False
    if isinstance(spec.get("workers"), int):
        spec["workers"] = max(1, min(spec["workers"], MAX_RUNNING_WORKERS))
    pod_spec = spec["template"]["spec"]
    pod_spec.update(copy.deepcopy(KWOK_PLACEMENT))


def _request_gpus(job: Obj, amount: int | str | None) -> None:
    containers = job["spec"]["template"]["spec"].get("containers") or []
    if amount is None or not containers or not isinstance(containers[0], dict):
        return
    resources = containers[0].setdefault("resources", {})
    resources.setdefault("limits", {})["nvidia.com/gpu"] = amount
    (resources.get("requests") or {}).pop("nvidia.com/gpu", None)


@st.composite
def _cases(draw: st.DrawFn, gen: Generator) -> Case:
    spec = draw(from_schema(gen.closed, codec="utf-8", allow_x00=False))
    spec = _dedupe(_without_nulls(spec), {k[1:] if k[:1] == ("spec",) else k: v
                                          for k, v in gen.list_maps.items()})
    name_length = draw(st.integers(1, 54))
    running = draw(st.booleans())
    treatment = draw(st.sampled_from(TREATMENTS))
    tag = f"c{next(gen.serial)}"  # unique: every job is new to the API server
    job: Obj = {"apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
                "metadata": {"name": tag + "x" * (name_length - len(tag))}, "spec": spec}
    _place(job, running)
    gpus = draw(st.sampled_from(GPU_QUANTITIES))
    if running:
        _request_gpus(job, gpus)
    repair(job)
    broken = ""
    expected: list[str] = []
    if treatment == "rule":
        rule = draw(st.sampled_from(BREAKABLE))
        rule.breaks(job)
        broken, expected = rule.message, [rule.path]
    elif treatment == "structural":
        options = list(breakages(gen.open, job["spec"], ("spec",)))
        chosen: Breakage = draw(st.sampled_from(options))
        chosen.apply(job)
        broken, expected = f"{chosen.what} at {chosen.path}", [chosen.path]
    expected += [p for p in violations(job) if p not in expected]
    return Case(job, treatment, running, tuple(expected), broken)


def _main_type(schema: Schema) -> str | None:
    types = schema.get("type")
    return next((t for t in (types if isinstance(types, list) else [types]) if t != "null"),
                None)


def _at_maximum(schema: Schema) -> Any:
    """A value of `schema` with every integer and number at its maximum; objects only where
    nothing else is required of them."""
    main = _main_type(schema)
    if main in ("integer", "number"):
        return schema.get("maximum", 1)
    return {name: _at_maximum(sub) for name, sub in (schema.get("properties") or {}).items()
            if _main_type(sub) in ("integer", "number")
            or (_main_type(sub) == "object" and not sub.get("required"))}


def boundary_cases(gen: Generator) -> list[Case]:
    """Two valid jobs (running, suspended) whose every number is at its schema maximum: the
    values a user may write that the operator's arithmetic (timeouts, deadlines) meets last."""
    out = []
    for running in (True, False):
        spec = _at_maximum(gen.closed)
        spec["template"] = {"spec": {"containers": [{"name": "tensorflow",
                                                     "image": "multiworker.local/base:bookworm"}]}}
        job: Obj = {"apiVersion": "multiworker.dev/v1alpha1", "kind": "MultiWorkerJob",
                    "metadata": {"name": f"max-{'running' if running else 'suspended'}"},
                    "spec": spec}
        _place(job, running)
        repair(job)
        out.append(Case(job, "valid", running, tuple(violations(job)), "numbers at maximum"))
    return out
