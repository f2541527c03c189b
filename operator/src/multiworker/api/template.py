"""spec.template: the operator's own typed view of a core/v1 PodTemplateSpec.

Only the fields the operator relies on are typed here; everything else is kept exactly as
written (extra="allow") and copied into the pods. The CRD's schema of spec.template is not
this: it is the pinned Kubernetes' full PodTemplateSpec (openapi.py), with the rules, bounds and
descriptions below laid over it (crd.overlay), so a field named here must exist there.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from multiworker.api import names
from multiworker.api.schema import OpenModel, cel, validations


class Container(OpenModel):
    """A core/v1 Container; the operator needs its name and image."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.restartPolicy) && !has(self.restartPolicyRules)",
                "spec.template.spec.containers[].restartPolicy and restartPolicyRules must be "
                "unset: a worker's container is never restarted alone, the operator restarts "
                "the whole group (a native sidecar goes in initContainers with restartPolicy "
                "Always)",
                ".restartPolicy",
            )
        )
    )

    name: str = Field(min_length=1)
    """Container name (a DNS label, unique in the pod). The one named `tensorflow` (or else
    the first) trains and gets TF_CONFIG and the MWJ_* environment."""
    image: str = Field(min_length=1)
    """Container image, e.g. multiworker.local/worker:dev. Required here: no workload
    controller fills it in later."""
    restart_policy: str | None = None
    """Must be unset: restarts are the operator's, by whole group."""
    restart_policy_rules: list[Any] | None = None
    """Must be unset: restarts are the operator's, by whole group."""

    @model_validator(mode="after")
    def _restarts_are_the_operators(self) -> Container:
        if self.restart_policy is not None or self.restart_policy_rules is not None:
            raise ValueError(
                f"containers[{self.name}]: restartPolicy and restartPolicyRules must be unset: "
                "the operator restarts the whole group, never one container")
        return self


class TemplateMetadata(OpenModel):
    """Labels and annotations copied onto every worker pod."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.labels) || self.labels.all(k, !k.startsWith('multiworker.dev/'))",
                "spec.template.metadata.labels: keys under multiworker.dev/ are reserved for "
                "the operator",
                ".labels",
            )
        )
    )

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels for every worker pod; keys under multiworker.dev/ are set by the operator."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations for every worker pod."""


class PodSpec(OpenModel):
    """A core/v1 PodSpec, the same for every worker (GPUs via resources.limits
    nvidia.com/gpu). hostname, subdomain and restartPolicy are set by the operator."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.restartPolicy) || self.restartPolicy == 'Never'",
                "spec.template.spec.restartPolicy must be Never or unset: the operator restarts "
                "the whole group, never one worker",
                ".restartPolicy",
            ),
            cel(
                "!has(self.hostname) && !has(self.subdomain)",
                "spec.template.spec.hostname and subdomain must be unset: the operator gives "
                "each worker its DNS name",
            ),
            cel(
                "!has(self.hostNetwork) || !self.hostNetwork",
                "spec.template.spec.hostNetwork must be false or unset: two workers on one "
                "node would clash on spec.port and spec.health.progressPort",
                ".hostNetwork",
            ),
        )
    )

    containers: list[Container] = Field(min_length=1)
    """The pod's containers, at least one; the one named `tensorflow` (or else the first)
    trains."""
    restart_policy: str | None = None
    """Must be Never or unset: failures restart the whole group, never one container."""
    hostname: str | None = None
    """Must be unset: the operator names each worker <job>-worker-<index>."""
    subdomain: str | None = None
    """Must be unset: the operator puts every worker in the job's headless Service."""
    host_network: bool | None = None
    """Must be false or unset: workers on one node would share its ports."""

    @model_validator(mode="after")
    def _operator_owned_fields(self) -> PodSpec:
        if self.restart_policy not in (None, "Never"):
            raise ValueError(
                f"restartPolicy {self.restart_policy!r} must be Never or unset: "
                "the operator restarts the whole group, never one worker"
            )
        if self.hostname is not None or self.subdomain is not None:
            raise ValueError("hostname and subdomain must be unset: the operator sets them")
        if self.host_network:
            raise ValueError("hostNetwork must be false or unset: two workers on one node "
                             "would clash on spec.port and spec.health.progressPort")
        return self


class PodTemplate(OpenModel):
    """A full core/v1 PodTemplateSpec for every worker. The container named `tensorflow` (or
    the first) trains and gets TF_CONFIG and the MWJ_* environment. Changes take effect when
    the next group starts (after a restart or a resume)."""

    metadata: TemplateMetadata | None = None
    """Labels and annotations for every worker pod."""
    spec: PodSpec
    """The pod spec of every worker, a core/v1 PodSpec (GPUs via resources.limits
    nvidia.com/gpu); restartPolicy, hostname and subdomain are the operator's."""

    @model_validator(mode="after")
    def _no_reserved_labels(self) -> PodTemplate:
        labels = self.metadata.labels if self.metadata else {}
        reserved = sorted(k for k in labels if k.startswith(f"{names.GROUP}/"))
        if reserved:
            raise ValueError(f"metadata.labels {reserved} are reserved for the operator")
        return self

    def trainer_container(self) -> str:
        """The container that trains: `tensorflow` if present, else the first one."""
        container_names = [c.name for c in self.spec.containers]
        if names.TRAINER_CONTAINER in container_names:
            return names.TRAINER_CONTAINER
        return container_names[0]

    def as_dict(self) -> dict[str, Any]:
        """The template exactly as the user wrote it (unknown fields included)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
