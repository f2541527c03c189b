"""Pure renderers: the Service, the worker pods and TF_CONFIG.

Every input is an argument (the owner too); no environment reads, no clock, no client.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from multiworker.api import contract, names
from multiworker.api.job import Job
from multiworker.api.spec import RestartMode
from multiworker.decide.gpus import PRODUCT_LABEL
from multiworker.decide.warm import WarmCommand, warm_command

Manifest = dict[str, Any]

# Lets the last lines of a crashed trainer's log show up in the pod status and our Events.
_TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"
# What the agent's two containers ask for: a quota on requests must see them; a Python loop
# reading two small files twenty times a second needs little.
_AGENT_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"},
                    "limits": {"memory": "64Mi"}}
AGENT_RESTART_EXIT = 86  # pod/agent.py's RESTART_EXIT
_POD_INFO_PATH = "/etc/multiworker"
_AGENT_STATE_PATH = "/run/multiworker"
_AGENT_SCRIPT_PATH = "/opt/multiworker-agent"
_AGENT_KEY_PATH = "/etc/multiworker-key"


_WARM_HOOK_DIR = "warm"  # under _AGENT_SCRIPT_PATH: on the spare interpreters' PYTHONPATH


# A shipped file's path in the mount, where it is not its name: the warm hook is the spares'
# sitecustomize, alone in a folder on their PYTHONPATH.
_SHIPPED_AS = {"warm_hook.py": f"{_WARM_HOOK_DIR}/sitecustomize.py"}


@cache
def shipped_scripts() -> dict[str, str]:
    """What the job's ConfigMap ships to run in the trainer's image: every file of
    multiworker/pod/ (the in-place agent, the warm launcher, the hook its spare interpreters
    start with), by file name."""
    folder = resources.files("multiworker") / "pod"
    return {f.name: f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".py") and f.name != "__init__.py"}


def shipped_items() -> list[Manifest]:
    """The ConfigMap volume's items: each shipped file beside the agent (the warm hook in its
    own folder)."""
    return [{"key": name, "path": _SHIPPED_AS.get(name, name)} for name in shipped_scripts()]


def cluster_config_name(job: Job) -> str:
    """The job's ConfigMap (render_cluster_config), named by what it holds: the agent's
    scripts are part of it, so an operator with another agent never reuses an older one."""
    shipped = hashlib.sha256(json.dumps(shipped_scripts(), sort_keys=True).encode()).hexdigest()
    return names.cluster_config_name(job.name, job.uid, job.spec.workers, job.spec.port, shipped)


def in_place(job: Job) -> bool:
    """Whether the job asks for in-place restarts (its pods then get the agent where every
    node they may land on can restart them: creation.py)."""
    return job.spec.restart_policy.mode is RestartMode.IN_PLACE


def pod_digest(job: Job, image: str | None) -> str:
    """What a worker pod is rendered from, but its index and generation: a pod whose digest
    differs from the job's now (its template, image, ports or volume were edited since) is
    recreated, never restarted in place. The warm standby is not part of it: a pod restarts
    in place with or without a launcher, and one created before an operator had launchers is
    no less this job's pod."""
    spec = job.spec
    checkpoint = spec.checkpoint.model_dump(mode="json") if spec.checkpoint else None
    rendered = [spec.template.as_dict(), image, spec.workers, spec.port,
                spec.health.progress_port, spec.health.peer_timeout_seconds,
                spec.health.collective_timeout_seconds, checkpoint,
                spec.restart_policy.agent_port]
    text = json.dumps(rendered, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owner_reference(job: Job) -> Manifest:
    """The controller reference every object of the job carries (garbage collection)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def tf_config(job: str, namespace: str, workers: int, port: int, index: int) -> Manifest:
    """TF_CONFIG for worker `index` as data: every worker's address and this worker's task
    (what a worker's process sees, once the kubelet has expanded worker_env's reference)."""
    return {
        "cluster": {"worker": json.loads(worker_addresses(job, namespace, workers, port))},
        "task": {"type": "worker", "index": index},
    }


def worker_addresses(job: str, namespace: str, workers: int, port: int) -> str:
    """Every worker's address as a JSON list: rendered once per group, into the ConfigMap."""
    return json.dumps([names.worker_address(job, namespace, i, port) for i in range(workers)],
                      separators=(",", ":"))


def render_cluster_config(job: Job, owner: Manifest) -> Manifest:
    """The ConfigMap every worker's TF_CONFIG takes its cluster from (worker_env): the
    group's addresses travel once per group instead of in each of its pods, so what every pod
    costs the API server, etcd and this operator's pod watch does not grow with the group."""
    spec = job.spec
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": cluster_config_name(job),
            "namespace": job.namespace,
            "labels": names.job_selector(job.name),
            "ownerReferences": [owner],
        },
        "data": {names.CLUSTER_CONFIG_KEY: worker_addresses(job.name, job.namespace,
                                                            spec.workers, spec.port),
                 **shipped_scripts()},
    }


def worker_env(job: Job, index: int, generation: int, agent: bool = False) -> list[Manifest]:
    """The environment contract (docs/contracts.md) for worker `index` of `generation`.
    TF_CONFIG refers to MWJ_WORKER_ADDRESSES, which the kubelet reads from the job's ConfigMap
    and expands before the process starts: the trainer sees the whole TF_CONFIG."""
    spec = job.spec
    addresses = {"name": contract.MWJ_WORKER_ADDRESSES, "valueFrom": {"configMapKeyRef": {
        "name": cluster_config_name(job),
        "key": names.CLUSTER_CONFIG_KEY}}}
    values: dict[str, str] = {
        contract.TF_CONFIG: (f'{{"cluster":{{"worker":$({contract.MWJ_WORKER_ADDRESSES})}},'
                             f'"task":{{"type":"worker","index":{index}}}}}'),
        contract.MWJ_JOB_NAME: job.name,
        contract.MWJ_JOB_NAMESPACE: job.namespace,
        contract.MWJ_JOB_UID: job.uid,
        contract.MWJ_NUM_WORKERS: str(spec.workers),
        **({contract.MWJ_MAX_WORKERS: str(job.max_workers),
            contract.MWJ_ELASTIC_BATCH: spec.elastic.batch.value} if spec.elastic else {}),
        contract.MWJ_WORKER_INDEX: str(index),
        contract.MWJ_PROGRESS_PORT: str(spec.health.progress_port),
        contract.MWJ_PEER_TIMEOUT_SECONDS: str(spec.health.peer_timeout_seconds),
        contract.MWJ_COLLECTIVE_TIMEOUT_SECONDS: str(spec.health.collective_timeout_seconds),
    }
    checkpoint = spec.checkpoint
    if checkpoint is not None:
        own = names.checkpoint_subdir(job.namespace, job.name, job.uid)
        values[contract.MWJ_CHECKPOINT_DIR] = posixpath.join(checkpoint.mount_path, own)
        if checkpoint.resume_from is not None:
            resume_dir = posixpath.join(checkpoint.mount_path, checkpoint.resume_from)
            values[contract.MWJ_RESUME_FROM_DIR] = posixpath.normpath(resume_dir)
    node = {"name": contract.MWJ_NODE_NAME,
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    # In place, the pod outlives its generation: the kubelet reads the number from the pod's
    # label each time it creates the trainer's container.
    restart_count = {"name": contract.MWJ_RESTART_COUNT, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{names.LABEL_GROUP_GENERATION}']"}}} \
        if agent else {"name": contract.MWJ_RESTART_COUNT, "value": str(generation)}
    if agent:
        # The agent's word (pod/agent.py), which may come before the label's.
        values[contract.MWJ_POD_GENERATION_FILE] = f"{_AGENT_STATE_PATH}/pod-generation"
    return [addresses, node, restart_count,
            *({"name": name, "value": value} for name, value in values.items())]


def render_service(job: Job, owner: Manifest) -> Manifest:
    """The headless Service that gives `<job>-worker-<i>.<job>.<ns>.svc` to every worker,
    published before the workers are ready so they can find each other while starting."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(job.name),
            "namespace": job.namespace,
            "labels": names.job_selector(job.name),
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.job_selector(job.name),
            "ports": [{"name": "tf", "port": job.spec.port, "targetPort": job.spec.port}],
        },
    }


def render_network_policy(job: Job, owner: Manifest, operator_namespace: str) -> Manifest:
    """Who may reach the job's workers: each other, on every port (the collective, the
    preflight), and the operator's pods, on the progress and restart agent ports only (the
    latter whatever the mode: the policy is made once, the mode may change). Nothing else — a pod
    elsewhere could otherwise hold all of a worker's /progress connections. Enforced only where
    the cluster's network plugin enforces NetworkPolicy."""
    workers = {"matchLabels": names.job_selector(job.name)}
    ports = [job.spec.health.progress_port, job.spec.restart_policy.agent_port]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.network_policy_name(job.name),
            "namespace": job.namespace,
            "labels": names.job_selector(job.name),
            "ownerReferences": [owner],
        },
        "spec": {
            "podSelector": workers,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": workers}]},
                {"from": [{"namespaceSelector": {"matchLabels": {
                              "kubernetes.io/metadata.name": operator_namespace}},
                           "podSelector": {"matchLabels": names.OPERATOR_POD_LABELS}}],
                 "ports": [{"protocol": "TCP", "port": port} for port in ports]},
            ],
        },
    }


def render_worker_pod(job: Job, index: int, generation: int, owner: Manifest, *,
                      image: str | None = None, gpu_product: str | None = None,
                      avoid_nodes: Sequence[str] = (), agent: bool = False) -> Manifest:
    """Worker `index` of group `generation`, built from spec.template; `image` replaces the
    training container's (a pinned digest), `gpu_product` selects nodes of one GPU model,
    `avoid_nodes` are never chosen (added to every required node-affinity term, and named in
    an annotation), `agent` adds the in-place restart agent (pod/agent.py)."""
    template = job.spec.template.as_dict()
    metadata = template.get("metadata") or {}
    pod_spec = copy.deepcopy(template["spec"])
    pod_spec["hostname"] = names.worker_name(job.name, index)
    pod_spec["subdomain"] = names.service_name(job.name)
    pod_spec["restartPolicy"] = "Never"

    trainer_name = job.spec.template.trainer_container()
    trainer = next(c for c in pod_spec["containers"] if c["name"] == trainer_name)
    ours = worker_env(job, index, generation, agent)
    reserved = {e["name"] for e in ours}
    # Ours first, so the user's variables can refer to them as $(MWJ_WORKER_INDEX).
    trainer["env"] = ours + [e for e in trainer.get("env", []) if e.get("name") not in reserved]
    if image is not None:
        trainer["image"] = image
    if gpu_product is not None:
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}),
                                    PRODUCT_LABEL: gpu_product}
    if avoid_nodes:
        _avoid(pod_spec, avoid_nodes)
    trainer.setdefault("terminationMessagePolicy", _TERMINATION_MESSAGE_POLICY)
    annotations = {**metadata.get("annotations", {}),
                   names.ANNOTATION_TRAINER: trainer_name,
                   names.ANNOTATION_PROGRESS_PORT: str(job.spec.health.progress_port)}
    if avoid_nodes:
        annotations[names.ANNOTATION_AVOIDED_NODES] = ",".join(avoid_nodes)
    if agent and _add_agent(job, pod_spec, trainer):
        annotations[names.ANNOTATION_WARM_AGENT_PORT] = str(job.spec.restart_policy.agent_port)
    if agent:
        annotations |= {names.ANNOTATION_RELEASED: str(generation),
                        names.ANNOTATION_TRAINER_RESTARTS: "0",
                        names.ANNOTATION_POD_DIGEST: pod_digest(job, image)}
    if job.spec.checkpoint is not None:
        _mount_checkpoint(pod_spec, trainer, job.spec.checkpoint.claim_name,
                          job.spec.checkpoint.mount_path)

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.worker_name(job.name, index),
            "namespace": job.namespace,
            "labels": {**metadata.get("labels", {}),
                       **names.worker_labels(job.name, index, generation)},
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": pod_spec,
    }


def _add_agent(job: Job, pod_spec: Manifest, trainer: Manifest) -> bool:
    """The in-place restart agent (pod/agent.py), first among the init containers: a
    sidecar whose exit restarts all of the pod's containers, then a gate that holds the rest
    of the pod until the operator releases its generation. The trainer's own failure restarts
    the pod's containers the same way (so its pod never ends failed and can be reused), and
    the gate holds the new trainer until the operator decides. True: the trainer runs in the
    warm launcher (pod/launcher.py), which restarts it without the kubelet."""
    image = trainer["image"]
    mounts: list[Manifest] = [{"name": names.AGENT_POD_INFO_VOLUME, "mountPath": _POD_INFO_PATH,
               "readOnly": True},
              {"name": names.AGENT_STATE_VOLUME, "mountPath": _AGENT_STATE_PATH},
              {"name": names.AGENT_SCRIPT_VOLUME, "mountPath": _AGENT_SCRIPT_PATH,
               "readOnly": True}]
    script = f"{_AGENT_SCRIPT_PATH}/{names.AGENT_SCRIPT_KEY}"
    def agent(name: str, mode: str) -> Manifest:
        return {"name": name, "image": image, "command": ["python3", script, mode],
                "resources": _AGENT_RESOURCES, "volumeMounts": mounts,
                "terminationMessagePolicy": _TERMINATION_MESSAGE_POLICY}
    heard = [{"name": "MWJ_AGENT_PORT", "value": str(job.spec.restart_policy.agent_port)},
             {"name": "MWJ_AGENT_POD_UID", "valueFrom": {"fieldRef": {
                 "fieldPath": "metadata.uid"}}},
             {"name": "MWJ_AGENT_KEY_FILE",
              "value": f"{_AGENT_KEY_PATH}/{names.AGENT_KEY_FILE}"}]
    # The job's key reaches the sidecar that hears the operator, and nothing else in the pod:
    # the trainer runs the user's code, which must not be able to sign a note.
    key_mount = {"name": names.AGENT_KEY_VOLUME, "mountPath": _AGENT_KEY_PATH, "readOnly": True}
    watcher = {**agent(names.AGENT_CONTAINER, "watch"), "env": heard,
               "volumeMounts": [*mounts, key_mount], "restartPolicy": "Always",
               "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {
                   "operator": "In", "values": [AGENT_RESTART_EXIT]}}]}
    ours = {names.AGENT_CONTAINER, names.GATE_CONTAINER}
    pod_spec["initContainers"] = [watcher, agent(names.GATE_CONTAINER, "gate"),
                                  *(c for c in pod_spec.get("initContainers", [])
                                    if c.get("name") not in ours)]
    # The trainer reads its pod's generation too (MWJ_POD_GENERATION_FILE), as the agent
    # knows it.
    trainer["volumeMounts"] = [*(m for m in trainer.get("volumeMounts", [])
                                 if m.get("name") != names.AGENT_STATE_VOLUME),
                               {"name": names.AGENT_STATE_VOLUME,
                                "mountPath": _AGENT_STATE_PATH, "readOnly": True}]
    trainer["restartPolicy"] = "Never"
    trainer["restartPolicyRules"] = [{"action": "RestartAllContainers", "exitCodes": {
        "operator": "NotIn", "values": [0]}}]
    warm = warm_command(trainer) if job.spec.restart_policy.warm_standby else None
    if isinstance(warm, WarmCommand):
        _wrap_in_launcher(job, trainer, warm, mounts)
    pod_info = {"name": names.AGENT_POD_INFO_VOLUME, "downwardAPI": {"items": [
        {"path": "generation",
         "fieldRef": {"fieldPath": f"metadata.labels['{names.LABEL_GROUP_GENERATION}']"}},
        {"path": "released",
         "fieldRef": {"fieldPath": f"metadata.annotations['{names.ANNOTATION_RELEASED}']"}}]}}
    script_volume = {"name": names.AGENT_SCRIPT_VOLUME, "configMap": {
        "name": cluster_config_name(job), "items": shipped_items()}}
    state = {"name": names.AGENT_STATE_VOLUME, "emptyDir": {"medium": "Memory",
                                                            "sizeLimit": "1Mi"}}
    # Optional: a pod whose key is missing still starts; its agent then refuses every note,
    # and the labels alone tell it (later).
    key = {"name": names.AGENT_KEY_VOLUME, "secret": {
        "secretName": names.agent_key_name(job.name, job.uid), "optional": True,
        "defaultMode": 0o400, "items": [{"key": names.AGENT_KEY_FILE,
                                         "path": names.AGENT_KEY_FILE}]}}
    agent_volumes = {names.AGENT_POD_INFO_VOLUME, names.AGENT_STATE_VOLUME,
                     names.AGENT_SCRIPT_VOLUME, names.AGENT_KEY_VOLUME}
    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in agent_volumes]
    pod_spec["volumes"] = [*volumes, pod_info, state, script_volume, key]
    return isinstance(warm, WarmCommand)


def _wrap_in_launcher(job: Job, trainer: Manifest, warm: WarmCommand,
                      mounts: list[Manifest]) -> None:
    """Make the warm launcher (pod/launcher.py) the trainer's process, in the field the
    user wrote (args keep the image's entrypoint): it runs the user's command line itself,
    in spare interpreters (warm.py). The line travels in environment variables, one word
    each and last, so the kubelet expands each word's $(VAR) references as it would in args
    — a value holding quotes or backslashes stays one word, as it is — and the launcher's own
    command line does not name the script (pkill -f train.py stops the trainer alone)."""
    line = [warm.interpreter, f"{_AGENT_SCRIPT_PATH}/{names.LAUNCHER_SCRIPT_KEY}"]
    if warm.field == "command":
        trainer["command"], trainer["args"] = line, []
    else:
        trainer["args"] = line
    ours = {"MWJ_AGENT_POD_INFO": _POD_INFO_PATH, "MWJ_AGENT_STATE": _AGENT_STATE_PATH,
            contract.MWJ_LAUNCHER_PRELOAD: ",".join(job.spec.restart_policy.warm_modules),
            contract.MWJ_LAUNCHER_HOOK: f"{_AGENT_SCRIPT_PATH}/{_WARM_HOOK_DIR}",
            contract.MWJ_LAUNCHER_ARGC: str(len(warm.argv)),
            **{f"{contract.MWJ_LAUNCHER_ARG_PREFIX}{i}": word
               for i, word in enumerate(warm.argv)}}
    trainer["env"] = [*(e for e in trainer.get("env", []) if e.get("name") not in ours
                        and not str(e.get("name")).startswith(contract.MWJ_LAUNCHER_ARG_PREFIX)),
                      *({"name": k, "value": v} for k, v in ours.items())]
    # The launcher writes its report into the agent's state and reads the pod's generation.
    shared = {m["name"] for m in mounts}
    trainer["volumeMounts"] = [*(m for m in trainer.get("volumeMounts", [])
                                 if m.get("name") not in shared), *mounts]


def _avoid(pod_spec: Manifest, nodes: Sequence[str]) -> None:
    """Terms of requiredDuringScheduling are ORed: the exclusion goes into each of them."""
    not_in = {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}
    affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*term.get("matchFields", []), not_in]} for term in terms]


def _mount_checkpoint(
    pod_spec: Manifest, trainer: Manifest, claim_name: str, mount_path: str
) -> None:
    volume = {"name": names.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim_name}}
    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") != names.CHECKPOINT_VOLUME]
    pod_spec["volumes"] = [*volumes, volume]
    mounts = [
        m for m in trainer.get("volumeMounts", []) if m.get("name") != names.CHECKPOINT_VOLUME
    ]
    trainer["volumeMounts"] = [*mounts, {"name": names.CHECKPOINT_VOLUME, "mountPath": mount_path}]
