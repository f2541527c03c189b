"""What `submit` sends: a MultiWorkerJob built from a manifest and the keyword options laid over
it, checked with the API's own models before it leaves, and the ConfigMap that ships a local
script. Pure: no API calls, no files read; the client does the I/O around these.

The options change only what they name, so `submit("examples/cpu-job.yaml", workers=2)` is
the example with two workers; without a manifest they build a whole job around one container
named `tensorflow`.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from multiworker.api import names
from multiworker.api.job import spec_problems
from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.client.errors import InvalidJob

# Kueue's queue label (its own name, not ours): a job carrying it waits for admission.
GPU_RESOURCE = "nvidia.com/gpu"
# A script shipped with `script=`: its ConfigMap, mounted read-only here in the trainer.
SCRIPT_VOLUME = "mwj-script"
SCRIPT_MOUNT = "/opt/mwj-script"
SCRIPT_INTERPRETER = "python3"


@dataclass(frozen=True)
class JobOptions:
    """The keyword options of `Client.submit`; None leaves a field as the manifest has it."""

    name: str | None = None
    image: str | None = None
    command: Sequence[str] | None = None
    """The trainer's command line, run under the image's entrypoint (the container's args:
    the entrypoint, tini in multiworker's images, stays PID 1 and forwards signals)."""
    script: str | None = None
    """The file name of a script shipped in the job's ConfigMap (`script_config_map`)."""
    args: Sequence[str] | None = None
    """Arguments after the command or script; alone, after the manifest's own."""
    workers: int | None = None
    gpus_per_worker: int | None = None
    cpu: str | None = None
    memory: str | None = None
    env: Mapping[str, str] | None = None
    checkpoint_claim: str | None = None
    restart_mode: str | None = None
    max_restarts: int | None = None
    elastic_min_workers: int | None = None
    queue: str | None = None
    labels: Mapping[str, str] | None = None


def parse_manifest(text: str, source: str = "manifest") -> dict[str, Any]:
    """The one MultiWorkerJob in YAML or JSON `text` (other documents, such as a claim written
    beside it, are left out)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidJob(f"{source} is not valid YAML: {' '.join(str(e).split())}") from e
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind", names.KIND) == names.KIND]
    if len(jobs) != 1:
        raise InvalidJob(f"{source} holds {len(jobs)} {names.KIND} documents; one is needed")
    return jobs[0]


def looks_like_text(source: str) -> bool:
    """A manifest given as a string is YAML or JSON text when it spans lines or opens an
    object; otherwise it names a file."""
    return "\n" in source or source.lstrip().startswith("{")


def build_manifest(base: Mapping[str, Any] | None, options: JobOptions) -> dict[str, Any]:
    """The job to submit: `base` (a parsed manifest, not changed) with `options` laid over it."""
    job: dict[str, Any] = copy.deepcopy(dict(base)) if base else {}
    if not base and not (options.command or options.script):
        raise InvalidJob("a job needs a command or a script (or a manifest)")
    job.setdefault("apiVersion", names.API_VERSION)
    job.setdefault("kind", names.KIND)
    meta = _mapping(job, "metadata", "metadata")
    if options.name:
        meta["name"] = options.name
    if options.labels or options.queue:
        labels = _mapping(meta, "labels", "metadata.labels")
        labels.update(options.labels or {})
        if options.queue:
            labels[names.QUEUE_LABEL] = options.queue
    spec = _mapping(job, "spec", "spec")
    if not base:
        spec["workers"] = 1  # unless options.workers says otherwise
    _lay_spec(spec, options)
    _lay_container(trainer(spec), options)
    if options.script:
        _mount_script(spec, meta.get("name", ""))
    return job


def _lay_spec(spec: dict[str, Any], options: JobOptions) -> None:
    if options.workers is not None:
        spec["workers"] = options.workers
    if options.checkpoint_claim:
        _mapping(spec, "checkpoint", "spec.checkpoint")["claimName"] = options.checkpoint_claim
    if options.restart_mode:
        _mapping(spec, "restartPolicy", "spec.restartPolicy")["mode"] = options.restart_mode
    if options.max_restarts is not None:
        _mapping(spec, "restartPolicy", "spec.restartPolicy")["maxRestarts"] = options.max_restarts
    if options.elastic_min_workers is not None:
        _mapping(spec, "elastic", "spec.elastic")["minWorkers"] = options.elastic_min_workers


def trainer(spec: dict[str, Any]) -> dict[str, Any]:
    """The training container of `spec` (named `tensorflow`, else the first), created when
    the spec has none."""
    pod = _mapping(_mapping(spec, "template", "spec.template"), "spec", "spec.template.spec")
    containers = pod.setdefault("containers", [])
    if not isinstance(containers, list):
        raise InvalidJob("spec.template.spec.containers: must be a list")
    found = next((c for c in containers
                  if isinstance(c, dict) and c.get("name") == names.TRAINER_CONTAINER),
                 containers[0] if containers else None)
    if found is None:
        found = {"name": names.TRAINER_CONTAINER}
        containers.append(found)
    if not isinstance(found, dict):
        raise InvalidJob("spec.template.spec.containers: each must be a mapping")
    return found


def _mapping(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    """parent[key], created empty when absent; InvalidJob naming `path` when not a mapping."""
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise InvalidJob(f"{path}: must be a mapping, not {type(value).__name__}")
    return value


def _lay_container(container: dict[str, Any], options: JobOptions) -> None:
    if options.image:
        container["image"] = options.image
    extra = list(options.args or [])
    if options.script:
        container["args"] = [SCRIPT_INTERPRETER, script_path(options.script), *extra]
    elif options.command:
        container["args"] = [*options.command, *extra]
    elif extra:
        container["args"] = [*container.get("args", []), *extra]
    if options.script or options.command:
        container.pop("command", None)  # the image's entrypoint runs the new command line
    _lay_resources(container, options)
    if options.env:
        container["env"] = merged_env(container.get("env", []), options.env)


def _lay_resources(container: dict[str, Any], options: JobOptions) -> None:
    """GPUs as a limit (the device plugin's rule); CPU requested; memory requested and capped
    alike, so a worker is never killed for memory the node promised it."""
    wanted: dict[str, dict[str, Any]] = {"limits": {}, "requests": {}}
    if options.gpus_per_worker is not None:
        wanted["limits"][GPU_RESOURCE] = options.gpus_per_worker
    if options.cpu:
        wanted["requests"]["cpu"] = options.cpu
    if options.memory:
        wanted["requests"]["memory"] = wanted["limits"]["memory"] = options.memory
    path = f"containers[{container.get('name')}].resources"
    for kind, values in wanted.items():
        if values:
            resources = _mapping(container, "resources", path)
            _mapping(resources, kind, f"{path}.{kind}").update(values)


def merged_env(env: list[dict[str, Any]], values: Mapping[str, str]) -> list[dict[str, Any]]:
    """`env` with `values` set: a variable already there keeps its place, new ones follow."""
    result = [{"name": e["name"], "value": str(values[e["name"]])} if e.get("name") in values
              else e for e in env]
    present = {e.get("name") for e in env}
    return result + [{"name": k, "value": str(v)} for k, v in values.items() if k not in present]


def script_path(file_name: str) -> str:
    return posixpath.join(SCRIPT_MOUNT, file_name)


def script_config_map_name(job: str) -> str:
    return f"{job}-script"


def _mount_script(spec: dict[str, Any], job: str) -> None:
    pod = spec["template"]["spec"]
    volumes = [v for v in pod.get("volumes", []) if v.get("name") != SCRIPT_VOLUME]
    pod["volumes"] = [*volumes, {"name": SCRIPT_VOLUME,
                                 "configMap": {"name": script_config_map_name(job)}}]
    container = trainer(spec)
    mounts = [m for m in container.get("volumeMounts", []) if m.get("name") != SCRIPT_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT,
                                           "readOnly": True}]


def script_config_map(job: str, namespace: str, file_name: str, content: str) -> dict[str, Any]:
    """The ConfigMap that ships a local script to every worker (owned by the job once it
    exists: `owner_reference`)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": script_config_map_name(job), "namespace": namespace,
                         "labels": names.job_selector(job)},
            "data": {file_name: content}}


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """A reference to the created job: what it owns is deleted with it."""
    meta = job["metadata"]
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": meta["name"],
            "uid": meta["uid"], "blockOwnerDeletion": False}


def problems(job: Mapping[str, Any]) -> list[str]:
    """Every reason the API's models refuse `job`, each naming its field (as the operator
    would say it); the API server checks the rest (unknown fields, its CEL rules)."""
    found: list[str] = []
    if job.get("kind") != names.KIND or job.get("apiVersion") != names.API_VERSION:
        found.append(f"kind: a {names.API_VERSION} {names.KIND} is needed, not "
                     f"{job.get('apiVersion')} {job.get('kind')}")
    name = (job.get("metadata") or {}).get("name")
    if not name:
        found.append("metadata.name: required (name=, --name, or the manifest's)")
    spec = job.get("spec") or {}
    try:
        parsed = MultiWorkerJobSpec.model_validate(spec)
    except ValidationError as e:
        return found + spec_problems(e)
    return found + (names.name_problems(name, parsed.workers) if name else [])


def validated(job: dict[str, Any]) -> dict[str, Any]:
    """`job`, or InvalidJob naming every field the API's models refuse."""
    found = problems(job)
    if found:
        raise InvalidJob("; ".join(found))
    return job
