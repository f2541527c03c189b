"""The entry point for notebooks and scripts: submit, find, suspend, resume and delete jobs in
one namespace of one cluster. What a job is built from is manifest.py's; reading one job is
job.py's.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from kubernetes import client

from multiworker.api import names
from multiworker.client import manifest as manifests
from multiworker.client.connection import REQUEST_TIMEOUT, as_dict, connect, translated
from multiworker.client.errors import ApiError, ClientError, InvalidJob, JobNotFound
from multiworker.client.job import Job
from multiworker.client.manifest import JobOptions

MERGE_PATCH = "application/merge-patch+json"
FORBIDDEN = 403


class Client:
    """Jobs in one namespace. The cluster is the kubeconfig's ($KUBECONFIG, else
    ~/.kube/config; `kubeconfig` and `context` choose another), or the pod's service account
    where there is none; the namespace is `namespace`, else the context's, else `default`."""

    def __init__(self, namespace: str | None = None, context: str | None = None,
                 kubeconfig: str | None = None) -> None:
        self.connection = connect(namespace, context, kubeconfig)

    @property
    def namespace(self) -> str:
        return self.connection.namespace

    def submit(
        self, manifest: str | Path | Mapping[str, Any] | None = None, *,
        name: str | None = None, image: str | None = None,
        command: Sequence[str] | None = None, script: str | Path | None = None,
        args: Sequence[str] | None = None, workers: int | None = None,
        gpus_per_worker: int | None = None, cpu: str | None = None, memory: str | None = None,
        env: Mapping[str, str] | None = None, checkpoint_claim: str | None = None,
        restart_mode: str | None = None, max_restarts: int | None = None,
        elastic_min_workers: int | None = None, queue: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Job:
        """Create a job and return it. `manifest`: a file, YAML text or a dict; the options
        change what they name in it, or build the whole job without one (then `name`,
        `image` and `command` or `script` are needed). `command` runs under the image's
        entrypoint; `script`, a local Python file, is shipped in a ConfigMap owned by the job
        and run with python3. The job is checked with the API's models first (InvalidJob
        names every bad field), and its checkpoint claim must exist."""
        if command is not None and script is not None:
            raise InvalidJob("give a command or a script, not both")
        if isinstance(command, str):
            raise InvalidJob(f"command is a list of words, e.g. {command.split()!r}, "
                             "not one string")
        content = _read(Path(script), "script") if script is not None else None
        options = JobOptions(
            name=name, image=image, command=command,
            script=Path(script).name if script is not None else None, args=args,
            workers=workers, gpus_per_worker=gpus_per_worker, cpu=cpu, memory=memory, env=env,
            checkpoint_claim=checkpoint_claim, restart_mode=restart_mode,
            max_restarts=max_restarts, elastic_min_workers=elastic_min_workers, queue=queue,
            labels=labels)
        job = manifests.validated(manifests.build_manifest(_base(manifest), options))
        meta = job["metadata"]
        if meta.setdefault("namespace", self.namespace) != self.namespace:
            raise InvalidJob(f"metadata.namespace: the manifest's {meta['namespace']} is not "
                             f"the client's {self.namespace}: pass namespace= (or -n) to match")
        self._check_claim(job)
        if content is None:
            return Job(self.connection, self._create(job))
        shipped = manifests.script_config_map(meta["name"], self.namespace,
                                              str(options.script), content)
        return Job(self.connection, self._create_with_script(job, shipped))

    def get(self, name: str) -> Job:
        """The job named `name`; JobNotFound when there is none."""
        return Job(self.connection, {"metadata": {"name": name,
                                                  "namespace": self.namespace}}).refresh()

    def list(self, selector: str | None = None,
             all_namespaces: bool = False) -> builtins.list[Job]:
        """The namespace's jobs (every namespace's with `all_namespaces`) by namespace and
        name, those matching the label `selector` when given."""
        where = "every namespace" if all_namespaces else self.namespace
        with translated(self.connection, f"list jobs in {where}"):
            custom = self.connection.custom
            found = as_dict(custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL, label_selector=selector,
                _request_timeout=REQUEST_TIMEOUT) if all_namespaces else
                custom.list_namespaced_custom_object(
                    names.GROUP, names.VERSION, self.namespace, names.PLURAL,
                    label_selector=selector, _request_timeout=REQUEST_TIMEOUT))
        items = sorted(found.get("items") or [],
                       key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
        return [Job(self.connection, item) for item in items]

    def delete(self, name: str) -> None:
        """Delete the job; its pods, Service and script ConfigMap go with it."""
        with translated(self.connection, f"delete job {self.namespace}/{name}",
                        not_found=lambda: self._missing(name)):
            self.connection.custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, name,
                propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT)

    def suspend(self, name: str) -> Job:
        """Suspend the job: its workers are deleted, the job and its checkpoints kept."""
        return self._set_suspend(name, True)

    def resume(self, name: str) -> Job:
        """Resume a suspended job: a new group starts from the last checkpoint."""
        return self._set_suspend(name, False)

    def _set_suspend(self, name: str, suspend: bool) -> Job:
        with translated(self.connection, f"patch job {self.namespace}/{name}",
                        not_found=lambda: self._missing(name)):
            patched = as_dict(self.connection.custom.patch_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, name,
                {"spec": {"suspend": suspend}}, _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT))
        return Job(self.connection, patched)

    def _missing(self, name: str) -> JobNotFound:
        return JobNotFound(f"job {self.namespace}/{name} not found")

    def _check_claim(self, job: dict[str, Any]) -> None:
        """A checkpoint claim that is not there would leave every worker Pending: say so now.
        (One we may not read is left to the scheduler.)"""
        claim = ((job["spec"].get("checkpoint") or {}).get("claimName"))
        if not claim:
            return
        missing = InvalidJob(
            f"spec.checkpoint.claimName: PersistentVolumeClaim {claim!r} does not exist in "
            f"namespace {self.namespace}: create it first (examples/checkpoint-pvc.yaml)")
        try:
            with translated(self.connection, f"read claim {self.namespace}/{claim}",
                            not_found=lambda: missing):
                self.connection.core.read_namespaced_persistent_volume_claim(
                    claim, self.namespace, _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT)
        except ApiError as e:
            if e.status != FORBIDDEN:
                raise

    def _create(self, job: dict[str, Any]) -> dict[str, Any]:
        name = job["metadata"]["name"]
        with translated(self.connection, f"create job {self.namespace}/{name}"):
            return as_dict(self.connection.custom.create_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, job,
                field_validation="Strict", _request_timeout=REQUEST_TIMEOUT))

    def _create_with_script(self, job: dict[str, Any],
                            shipped: dict[str, Any]) -> dict[str, Any]:
        """The script's ConfigMap first (the pods mount it), then the job; then the job owns
        the ConfigMap, so it is deleted with the job. A job refused takes its ConfigMap away."""
        core, name = self.connection.core, shipped["metadata"]["name"]
        with translated(self.connection, f"create ConfigMap {self.namespace}/{name}"):
            core.create_namespaced_config_map(
                self.namespace, client.V1ConfigMap.model_validate(shipped), _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT)
        try:
            created = self._create(job)
        except BaseException:
            with suppress(ClientError), translated(self.connection, "delete ConfigMap"):
                core.delete_namespaced_config_map(name, self.namespace, _preload_content=False,
                                                  _request_timeout=REQUEST_TIMEOUT)
            raise
        owned = {"metadata": {"ownerReferences": [manifests.owner_reference(created)]}}
        with translated(self.connection, f"patch ConfigMap {self.namespace}/{name}"):
            core.patch_namespaced_config_map(name, self.namespace, owned,
                                             _content_type=MERGE_PATCH, _preload_content=False,
                                             _request_timeout=REQUEST_TIMEOUT)
        return created


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise InvalidJob(f"{what} {path}: {e.strerror or e}") from e


def _base(manifest: str | Path | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if manifest is None:
        return None
    if isinstance(manifest, Mapping):
        return dict(manifest)
    if isinstance(manifest, str) and manifests.looks_like_text(manifest):
        return manifests.parse_manifest(manifest)
    return manifests.parse_manifest(_read(Path(manifest), "manifest"), str(manifest))
