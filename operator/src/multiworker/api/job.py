"""The job as the operator sees it: identity, parsed spec and last written status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from multiworker.api import names
from multiworker.api.spec import MultiWorkerJobSpec
from multiworker.api.status import JobStatus, parse_status


class InvalidJobSpec(ValueError):
    """The job's spec breaks a rule the CRD could not enforce; `problems` name each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def spec_problems(error: ValidationError) -> list[str]:
    """Every validation error as `field.path: message`, in the CRD's camelCase."""
    problems = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{_field_path(item['loc'])}: {message}")
    return problems


@dataclass(frozen=True)
class Job:
    """A MultiWorkerJob: identity, parsed spec and last written status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: MultiWorkerJobSpec
    status: JobStatus
    created: datetime | None = None
    full_workers: int = 0  # spec.workers as written, where at_size() changed it; 0: unchanged

    @property
    def max_workers(self) -> int:
        return self.full_workers or self.spec.workers

    def sized(self) -> Job:
        """The job at its current group's size: spec.elastic's (status.groupWorkers), no
        larger than what Kueue admitted (status.admittedWorkers)."""
        sizes = [n for n in (self.status.group_workers, self.status.admitted_workers) if n]
        return self.at_size(min(sizes) if sizes else None)

    def at_size(self, workers: int | None) -> Job:
        """The job as its current group is made: spec.workers is the group's size (which
        spec.elastic may make smaller), so every object rendered from it — TF_CONFIG, the
        ConfigMap, the PodGroup, Kueue's podSet, the pod digest — follows the size."""
        # Never above spec.workers: a job edited smaller while shrunk is simply whole.
        if workers is None or workers >= self.spec.workers or self.spec.elastic is None:
            return self
        return replace(self, spec=self.spec.model_copy(update={"workers": workers}),
                       full_workers=self.max_workers)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Job:
        """Parse a job as read from the API. Raises status.UnreadableStatus first (nothing
        may be done on a status we cannot read), then InvalidJobSpec naming every bad field."""
        meta = body.get("metadata", {})
        name = meta.get("name", "")
        status = parse_status(body.get("status"))
        problems: list[str] = []
        spec: MultiWorkerJobSpec | None = None
        try:
            spec = MultiWorkerJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            problems.extend(spec_problems(e))
        if spec is not None:
            problems.extend(names.name_problems(name, spec.workers))
        if problems or spec is None:
            raise InvalidJobSpec(problems)
        created = meta.get("creationTimestamp")
        return cls(
            name=name,
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
            spec=spec,
            status=status,
            created=datetime.fromisoformat(created) if created else None,
        )
