"""What the API server must say about a generated job: accept it, or refuse it naming a field.

- The CRD's CEL rules (x-kubernetes-validations) are written here as Python predicates, each
  with a repair (to generate jobs that pass) and a breakage (to generate jobs that must not),
  matched to the CRD's rules by their message. A CRD rule this file does not know is counted
  and only allowed to refuse (its own message then names the field).
- Structural breakages are derived from the CRD's schema at each field a job has: a bound
  crossed, an enum missed, a wrong type, a required field dropped, an unknown field added,
  an empty list or string below its minimum, a duplicate in a set.
Rules see the job as the API server does: with the schema's defaults applied first.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.chaos.schema import Schema

Obj = dict[str, Any]
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RESERVED = "multiworker.dev/"


def apply_defaults(schema: Schema, value: Any) -> Any:
    """`value` with the OpenAPI schema's defaults filled in, as the API server stores it."""
    if isinstance(value, dict) and schema.get("properties"):
        out = dict(value)
        for name, sub in schema["properties"].items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _spec(job: Obj) -> Obj:
    spec: Obj = job.setdefault("spec", {})
    return spec


def _workers_digits(job: Obj) -> int:
    workers = _get(job, "spec", "workers")
    return len(str(workers - 1)) if isinstance(workers, int) else 1


@dataclass(frozen=True)
class Rule:
    """One CEL rule of the CRD: `message` starts the CRD's; `path` is the field it names."""

    message: str
    path: str
    violated: Callable[[Obj], bool]  # on the defaulted job
    repair: Callable[[Obj], None]
    breaks: Callable[[Obj], None]


def _name_ok(job: Obj) -> bool:
    return DNS_1035.fullmatch(job["metadata"]["name"]) is not None


def _long_name(job: Obj) -> bool:
    return len(job["metadata"]["name"]) + _workers_digits(job) > 55


def _shorten(job: Obj) -> None:
    job["metadata"]["name"] = job["metadata"]["name"][:55 - _workers_digits(job)].rstrip("-")


def _lengthen(job: Obj) -> None:
    _spec(job)["workers"] = 1000
    job["metadata"]["name"] = (job["metadata"]["name"] + "x" * 60)[:53]


def _ports(job: Obj) -> tuple[Any, Any]:
    return _get(job, "spec", "port"), _get(job, "spec", "health", "progressPort")


def _split_ports(job: Obj) -> None:
    port, progress = _ports(apply_defaults_job(job))
    if port == progress:
        _spec(job)["port"] = progress % 65535 + 1


def _same_ports(job: Obj) -> None:
    _spec(job)["port"] = _ports(apply_defaults_job(job))[1]


def _agent_port_taken(job: Obj) -> bool:
    agent = _get(job, "spec", "restartPolicy", "agentPort")
    return (_get(job, "spec", "restartPolicy", "mode") == "InPlace" and isinstance(agent, int)
            and agent in _ports(job))


def _free_agent_port(job: Obj) -> None:
    defaulted = apply_defaults_job(job)
    taken = set(_ports(defaulted))
    agent = _get(defaulted, "spec", "restartPolicy", "agentPort")
    while agent in taken:
        agent = agent % 65535 + 1
    _spec(job).setdefault("restartPolicy", {})["agentPort"] = agent


def _take_agent_port(job: Obj) -> None:
    policy = _spec(job).setdefault("restartPolicy", {})
    policy.update(mode="InPlace", agentPort=_ports(apply_defaults_job(job))[1])


def _backoff(job: Obj) -> tuple[Any, Any]:
    policy = _get(job, "spec", "restartPolicy") or {}
    return policy.get("backoffSeconds"), policy.get("maxBackoffSeconds")


def _backoff_bad(job: Obj) -> bool:
    base, cap = _backoff(job)
    return isinstance(base, int) and isinstance(cap, int) and cap < base


def _cap_backoff(job: Obj) -> None:
    base, cap = _backoff(apply_defaults_job(job))
    if isinstance(base, int) and isinstance(cap, int) and cap < base:
        _spec(job).setdefault("restartPolicy", {})["maxBackoffSeconds"] = base


def _invert_backoff(job: Obj) -> None:
    policy = _spec(job).setdefault("restartPolicy", {})
    policy.update(backoffSeconds=60, maxBackoffSeconds=5)


def _labels(job: Obj) -> Obj:
    found = _get(job, "spec", "template", "metadata", "labels")
    return found if isinstance(found, dict) else {}


def _drop_reserved(job: Obj) -> None:
    labels = _labels(job)
    for key in [k for k in labels if k.startswith(RESERVED)]:
        del labels[key]


def _add_reserved(job: Obj) -> None:
    meta = _spec(job)["template"].get("metadata")
    if not isinstance(meta, dict):
        meta = _spec(job)["template"]["metadata"] = {}
    meta.setdefault("labels", {})[f"{RESERVED}job-name"] = "x"


def _pod_spec(job: Obj) -> Obj:
    found: Obj = _spec(job)["template"]["spec"]
    return found


def _pop(*keys: str) -> Callable[[Obj], None]:
    def repair(job: Obj) -> None:
        for key in keys:
            _pod_spec(job).pop(key, None)
    return repair


def _set(key: str, value: Any) -> Callable[[Obj], None]:
    return lambda job: _pod_spec(job).update({key: value})


def _tf_config_too_big(job: Obj) -> bool:
    """names.tf_config_bound > names.MAX_ENV_STRING, as the CRD's rule computes it."""
    workers = _get(job, "spec", "workers")
    if not isinstance(workers, int):
        return False
    per_worker = 2 * len(job["metadata"]["name"]) + len(str(workers - 1)) + 86
    return workers * per_worker + 100 > 131072


def _fewer_workers(job: Obj) -> None:
    while _tf_config_too_big(job):
        _spec(job)["workers"] = max(1, _spec(job)["workers"] // 2)


def _many_workers(job: Obj) -> None:
    """1,024 workers and a 51-character name: a valid longest hostname, ~196 KB of TF_CONFIG."""
    _spec(job)["workers"] = 1024
    job["metadata"]["name"] = (job["metadata"]["name"] + "x" * 60)[:51]


def _containers(job: Obj) -> list[Obj]:
    found = _get(job, "spec", "template", "spec", "containers")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def _min_above_workers(job: Obj) -> bool:
    minimum, workers = _get(job, "spec", "elastic", "minWorkers"), _get(job, "spec", "workers")
    return isinstance(minimum, int) and isinstance(workers, int) and minimum > workers


def _lower_min_workers(job: Obj) -> None:
    if _min_above_workers(job):
        _spec(job)["elastic"]["minWorkers"] = _spec(job)["workers"]


def _raise_min_workers(job: Obj) -> None:
    """minWorkers one above workers, both within their bounds (1..1024)."""
    workers = _get(job, "spec", "workers")
    workers = min(workers, 1023) if isinstance(workers, int) and workers >= 1 else 1
    _spec(job)["workers"] = workers
    elastic = _spec(job).get("elastic")
    if not isinstance(elastic, dict):
        elastic = _spec(job)["elastic"] = {}
    elastic["minWorkers"] = workers + 1


def _container_restarts(job: Obj) -> bool:
    return any("restartPolicy" in c or "restartPolicyRules" in c for c in _containers(job))


def _drop_container_restarts(job: Obj) -> None:
    for container in _containers(job):
        container.pop("restartPolicy", None)
        container.pop("restartPolicyRules", None)


def _restart_one_container(job: Obj) -> None:
    _containers(job)[0]["restartPolicy"] = "Always"


RULES = [
    Rule("metadata.name must be a DNS-1035 label", "metadata.name",
         lambda j: not _name_ok(j), lambda j: None,
         lambda j: j["metadata"].update(name="Chaos_" + j["metadata"]["name"])),
    Rule("metadata.name is too long for spec.workers", "metadata.name", _long_name, _shorten,
         _lengthen),
    Rule("spec.health.progressPort must differ from spec.port", "spec.health.progressPort",
         lambda j: isinstance(_ports(j)[0], int) and _ports(j)[0] == _ports(j)[1],
         _split_ports, _same_ports),
    Rule("spec.restartPolicy.agentPort must differ from spec.port and spec.health.progressPort",
         "spec.restartPolicy.agentPort", _agent_port_taken, _free_agent_port, _take_agent_port),
    Rule("spec.workers can only change while the job is suspended", "spec.workers",
         lambda j: False, lambda j: None, lambda j: None),  # updates only; jobs are new here
    Rule("spec.restartPolicy.maxBackoffSeconds must be at least backoffSeconds",
         "spec.restartPolicy.maxBackoffSeconds", _backoff_bad, _cap_backoff, _invert_backoff),
    Rule("spec.template.metadata.labels: keys under multiworker.dev/ are reserved",
         "spec.template.metadata.labels",
         lambda j: any(k.startswith(RESERVED) for k in _labels(j)), _drop_reserved,
         _add_reserved),
    Rule("spec.template.spec.restartPolicy must be Never or unset",
         "spec.template.spec.restartPolicy",
         lambda j: _get(j, "spec", "template", "spec", "restartPolicy") not in (None, "Never"),
         _pop("restartPolicy"), _set("restartPolicy", "Always")),
    Rule("spec.template.spec.hostname and subdomain must be unset",
         "spec.template.spec.hostname",
         lambda j: any(k in (_get(j, "spec", "template", "spec") or {})
                       for k in ("hostname", "subdomain")),
         _pop("hostname", "subdomain"), _set("hostname", "mine")),
    Rule("spec.workers is too large for metadata.name", "spec.workers", _tf_config_too_big,
         _fewer_workers, _many_workers),
    Rule("spec.template.spec.containers[].restartPolicy and restartPolicyRules must be unset",
         "spec.template.spec.containers[0].restartPolicy", _container_restarts,
         _drop_container_restarts, _restart_one_container),
    Rule("spec.elastic.minWorkers must not exceed spec.workers", "spec.elastic.minWorkers",
         _min_above_workers, _lower_min_workers, _raise_min_workers),
    Rule("spec.template.spec.hostNetwork must be false or unset",
         "spec.template.spec.hostNetwork",
         lambda j: _get(j, "spec", "template", "spec", "hostNetwork") is True,
         _pop("hostNetwork"), _set("hostNetwork", True)),
]
BREAKABLE = [r for r in RULES if r.message != "spec.workers can only change while the job is "
             "suspended"]

_SPEC_SCHEMA: Schema = {}


def use_schema(openapi: Schema) -> None:
    """The CRD's schema the defaults come from."""
    _SPEC_SCHEMA.clear()
    _SPEC_SCHEMA.update(openapi)


def apply_defaults_job(job: Obj) -> Obj:
    defaulted: Obj = apply_defaults(_SPEC_SCHEMA, job) if _SPEC_SCHEMA else job
    return defaulted


def crd_rules(openapi: Schema, path: str = "") -> Iterator[tuple[str, str]]:
    """Every CEL rule of the CRD: (where, message)."""
    for rule in openapi.get("x-kubernetes-validations", []):
        yield path or "<root>", str(rule.get("message", rule.get("rule", "")))
    for name, sub in (openapi.get("properties") or {}).items():
        yield from crd_rules(sub, f"{path}.{name}" if path else name)
    if isinstance(openapi.get("items"), dict):
        yield from crd_rules(openapi["items"], f"{path}[]")


def unknown_rules(openapi: Schema) -> list[str]:
    return [f"{where}: {message}" for where, message in crd_rules(openapi)
            if not any(message.startswith(r.message) for r in RULES)]


def violations(job: Obj) -> list[str]:
    """The fields the known rules say the API server must name when refusing `job`."""
    defaulted = apply_defaults_job(job)
    found = []
    for rule in RULES:
        try:
            if rule.violated(defaulted):
                found.append(rule.path)
        except (TypeError, KeyError, AttributeError):
            continue  # a structurally broken job: the schema refuses it first
    return found


def repair(job: Obj) -> None:
    for rule in RULES:
        rule.repair(job)


def _pattern(path: str) -> str:
    """A regex for `path` (`a.b[0].c`) in which a list item may be named by index or, in
    server-side apply's notation, by its value or key (`b[=5]`, `b[name="x"]`)."""
    return r"\[[^\]]*\]".join(re.escape(p) for p in re.split(r"\[\d+\]", path))


def names(message: str, path: str) -> bool:
    """Whether the API server's message names the field at `path` (`a.b[0].c`)."""
    if re.search(_pattern(path), message):
        return True
    # Server-side apply's typed-patch notation for an item of a list map: `.spec.template.spec
    # .containers: element 1: ... omits all key fields ["name"]` (a field of the item), or
    # `... env: element 0: associative list with keys may not have non-map elements` (itself).
    item = re.match(r"(.*)\[(\d+)\](?:\.([^.\[]+))?$", path)
    if item is not None and re.search(f"{_pattern(item[1])}: element {item[2]}:", message) \
            and (item[3] is None or f'"{item[3]}"' in message):
        return True
    # ... and for a duplicate in a set, the set and the value: `.spec.x[7].values: duplicate
    # entries for key [=120]`.
    member = re.match(r"(.*)\[\d+\]$", path)
    return member is not None and \
        re.search(f"{_pattern(member[1])}: duplicate entries", message) is not None
