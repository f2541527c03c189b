"""Gang scheduling through the coscheduling plugin of scheduler-plugins: pure pieces.

MultiWorkerMirroredStrategy needs every worker at once, so a group that only partly fits
should hold nothing while it waits. With `spec.gang` on, each generation gets a PodGroup
(scheduling.x-k8s.io/v1alpha1) with `minMember` = workers; its pods carry the PodGroup label
and the coscheduling scheduler's name, and that scheduler binds them all or none. Everything
here is pure: manifests in, manifests or words out.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from multiworker.api import names
from multiworker.api.job import Job
from multiworker.api.spec import MultiWorkerJobSpec

Manifest = dict[str, Any]
Pod = Mapping[str, Any]

API_GROUP = "scheduling.x-k8s.io"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "PodGroup"
PLURAL = "podgroups"
CRD_NAME = f"{PLURAL}.{API_GROUP}"
# The label the Coscheduling plugin groups pods by (v1alpha1.PodGroupLabel).
POD_GROUP_LABEL = names.LABEL_POD_GROUP

_SUFFIX = "-g"


def pod_group_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{path}/{name}" if name else path


def gang_enabled(spec: MultiWorkerJobSpec, default: bool) -> bool:
    """Whether the job is gang scheduled: its own `spec.gang.enabled`, else the operator's
    default (`--default-gang-scheduling`)."""
    return default if spec.gang.enabled is None else spec.gang.enabled


def pod_group_name(job: str, generation: int) -> str:
    """The PodGroup of one generation: `<job>-g<generation>`.

    The name is also the value of the pods' PodGroup label, so it must stay within 63
    characters; a longer one keeps a prefix of the job name and a hash of the whole.
    """
    suffix = f"{_SUFFIX}{generation}"
    name = f"{job}{suffix}"
    if len(name) <= names.MAX_DNS_LABEL:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:8]
    keep = names.MAX_DNS_LABEL - len(suffix) - len(digest) - 1
    return f"{job[:keep].rstrip('-')}-{digest}{suffix}"


def pod_group_labels(job: str, generation: int) -> dict[str, str]:
    """Labels of a job's PodGroup: found by job like its pods, one per generation."""
    return {names.LABEL_JOB_NAME: job, names.LABEL_GROUP_GENERATION: str(generation)}


def render_pod_group(job: Job, generation: int, owner: Manifest) -> Manifest:
    """The PodGroup of `generation`: all `spec.workers` pods must fit before any is bound.

    Owned by the job (garbage collection); deleting the old generation's pods should delete
    its PodGroup too (`stale_pod_groups`).
    """
    gang = job.spec.gang
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": pod_group_name(job.name, generation),
            "namespace": job.namespace,
            "labels": pod_group_labels(job.name, generation),
            "ownerReferences": [owner],
        },
        "spec": {
            "minMember": job.spec.workers,
            "scheduleTimeoutSeconds": gang.schedule_timeout_seconds,
        },
    }


@dataclass(frozen=True)
class GangPodFields:
    """What a gang-scheduled worker pod carries: the PodGroup label and the scheduler."""

    labels: dict[str, str]
    scheduler_name: str


def gang_pod_fields(job: Job, generation: int) -> GangPodFields:
    return GangPodFields(
        labels={POD_GROUP_LABEL: pod_group_name(job.name, generation)},
        scheduler_name=job.spec.gang.scheduler_name,
    )


def with_gang_fields(pod: Manifest, fields: GangPodFields) -> Manifest:
    """A copy of a rendered worker pod with the gang's label and schedulerName (both replace
    whatever the template said: a worker outside its group would never be placed)."""
    result = copy.deepcopy(pod)
    metadata = result.setdefault("metadata", {})
    metadata["labels"] = {**metadata.get("labels", {}), **fields.labels}
    result.setdefault("spec", {})["schedulerName"] = fields.scheduler_name
    return result


def stale_pod_groups(pod_groups: Iterable[Mapping[str, Any]], job_uid: str,
                     generation: int) -> list[str]:
    """Names of the job's PodGroups of other generations: deleted with their pods. PodGroups
    the job does not control are never listed."""
    stale = []
    for group in pod_groups:
        meta = group.get("metadata", {})
        owned = any(ref.get("uid") == job_uid and ref.get("controller")
                    for ref in meta.get("ownerReferences", []))
        label = meta.get("labels", {}).get(names.LABEL_GROUP_GENERATION)
        if owned and label != str(generation):
            stale.append(meta.get("name", ""))
    return sorted(stale)


def pod_group_api_served(resources: Mapping[str, Any] | None) -> bool:
    """Whether discovery of `/apis/scheduling.x-k8s.io/v1alpha1` (None: 404) lists podgroups,
    i.e. the PodGroup CRD is installed and established."""
    if not resources:
        return False
    return any(r.get("name") == PLURAL for r in resources.get("resources", []))


def unavailable_message(scheduler_name: str) -> str:
    """Why a gang job cannot start on a cluster without the PodGroup CRD, and what to do."""
    return (
        f"gang scheduling is on but the PodGroup CRD ({CRD_NAME}, {API_VERSION}) is not "
        f"installed: install the scheduler-plugins coscheduling scheduler (schedulerName "
        f"{scheduler_name!r}) and its CRD, or set spec.gang.enabled: false; no workers are "
        "created until then"
    )
