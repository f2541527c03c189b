"""Who controls an object: the one ownership test, for pods, the Service and PodGroups alike.

Objects are ours when their controller reference is the job's uid; an object with our name
or labels but another controller is never touched (a Warning says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from multiworker.api import names


class Owned(Enum):
    OURS = "ours"
    WAIT = "wait"  # gone meanwhile, or an old pod of ours this pass did not see yet
    FOREIGN = "foreign"  # another controller's: never touched


def controlled_by(meta: Mapping[str, Any], uid: str) -> bool:
    """Whether an object's controller reference is the job with `uid`."""
    return any(ref.get("controller") and ref.get("uid") == uid
               for ref in meta.get("ownerReferences") or [])


def ownership(obj: Mapping[str, Any] | None, uid: str, *, generation: int | None) -> Owned:
    """Who controls an object that already existed when we created it; with `generation`,
    ours only if it also belongs to that group generation."""
    if obj is None:
        return Owned.WAIT
    meta = obj["metadata"]
    if not controlled_by(meta, uid):
        return Owned.FOREIGN
    label = (meta.get("labels") or {}).get(names.LABEL_GROUP_GENERATION)
    return Owned.OURS if generation is None or label == str(generation) else Owned.WAIT
