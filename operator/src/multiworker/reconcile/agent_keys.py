"""The key a job's in-place agents check the operator's notes with (pod/agent.py): one
Secret per job, owned by it (deleted with it), created before its first pods and mounted into
the agent sidecar alone (render.py). Every note a pass sends is signed with it
(clients/agents.py): anyone who can list pods can name a pod's uid, but only the operator
and the sidecar hold the key.

The operator keeps no copy: a pass that sends notes reads the Secret (a few reads a restart),
so a new leader signs as the old one did."""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from multiworker.api import names
from multiworker.api.job import Job
from multiworker.decide.ownership import Owned, ownership
from multiworker.reconcile.context import Pass
from multiworker.reconcile.render import in_place

Manifest = dict[str, Any]

KEY_BYTES = 32


def render_agent_key(job: Job, owner: Manifest, key: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.agent_key_name(job.name, job.uid),
            "namespace": job.namespace,
            "labels": names.job_selector(job.name),
            "ownerReferences": [owner],
        },
        "data": {names.AGENT_KEY_FILE: base64.b64encode(key.encode()).decode()},
    }


def new_agent_key(job: Job, owner: Manifest) -> Manifest:
    """The Secret, with a fresh random key (hex: the agent reads it as text)."""
    return render_agent_key(job, owner, secrets.token_hex(KEY_BYTES))


def agent_key_found(p: Pass) -> tuple[Owned, bytes | None]:
    """The job's Secret as the API server has it: whose it is, and its key where it is ours."""
    found = p.cluster.get_object(names.secret_path(
        p.job.namespace, names.agent_key_name(p.job.name, p.job.uid)))
    owned = ownership(found, p.job.uid, generation=None)
    if found is None or owned is not Owned.OURS:
        return owned, None
    data = (found.get("data") or {}).get(names.AGENT_KEY_FILE) or ""
    try:
        key = base64.b64decode(data, validate=True).strip()
    except (binascii.Error, ValueError):
        return owned, None
    return owned, key or None


def agent_key(p: Pass) -> bytes | None:
    """The key to sign this pass's notes with; None for a job without in-place restarts, or
    whose Secret is gone or not its own (the notes then go unsigned: an agent shipped before
    notes were signed still hears them, a newer one refuses them and its labels tell)."""
    if not in_place(p.job):
        return None
    _, key = agent_key_found(p)
    if key is None:
        p.log.warning("no key of its own to sign the agents' notes with (Secret %s)",
                      names.agent_key_name(p.job.name, p.job.uid))
    return key
