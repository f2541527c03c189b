"""The one source of names, labels and selectors: used both to build objects and to find them."""

from __future__ import annotations

import hashlib
import re

GROUP = "multiworker.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MultiWorkerJob"
PLURAL = "multiworkerjobs"
SINGULAR = "multiworkerjob"
SHORT_NAME = "mwj"
CRD_NAME = f"{PLURAL}.{GROUP}"

LABEL_JOB_NAME = f"{GROUP}/job-name"
LABEL_WORKER_INDEX = f"{GROUP}/worker-index"
LABEL_GROUP_GENERATION = f"{GROUP}/group-generation"
# What a worker pod was created with, so it is judged by that, not by a template edited since
# (template changes take effect with the next group): its training container, and the port
# where it serves GET /progress.
ANNOTATION_TRAINER = f"{GROUP}/trainer-container"
ANNOTATION_PROGRESS_PORT = f"{GROUP}/progress-port"
# In-place restarts (pod/agent.py): the generation whose trainer may start in the pod
# (the agent's gate holds the pod's containers until it equals the group-generation label),
# the trainer's restart count when that generation was released (a higher count means that
# generation's trainer has ended), and what the pod was rendered from (a digest: a pod whose
# template was edited since is recreated, never restarted in place).
ANNOTATION_RELEASED = f"{GROUP}/released-generation"
ANNOTATION_TRAINER_RESTARTS = f"{GROUP}/trainer-restarts"
ANNOTATION_POD_DIGEST = f"{GROUP}/pod-digest"
ANNOTATION_RESTARTED_AT = f"{GROUP}/restarted-at"  # moved in place, then released: its start
# The trainer's exit as the operator first saw it (JSON: generation, exitCode, reason, message,
# finishedAt): the kubelet's restart of all containers replaces it with its own record soon.
ANNOTATION_TRAINER_EXIT = f"{GROUP}/trainer-exit"
# The nodes a pod was created to avoid (comma-separated): their Lease was silent then. A pod the
# scheduler refuses while one of them is back is placed anew (policy.replacement_action).
ANNOTATION_AVOIDED_NODES = f"{GROUP}/avoided-nodes"
AGENT_CONTAINER = "mwj-agent"
GATE_CONTAINER = "mwj-gate"
AGENT_POD_INFO_VOLUME = "mwj-pod-info"
AGENT_STATE_VOLUME = "mwj-agent-state"
AGENT_SCRIPT_VOLUME = "mwj-agent-script"
AGENT_SCRIPT_KEY = "agent.py"
AGENT_KEY_VOLUME = "mwj-agent-key"
AGENT_KEY_FILE = "key"  # the Secret's one key, and its file in the agent's mount
# The warm launcher (pod/launcher.py) and the hook its spare interpreters start with, shipped
# beside the agent (the ConfigMap's keys are the pod folder's file names); and its last report
# that the operator acts on (JSON: generation, state, exit), copied onto the pod from the
# agent's GET /trainer.
LAUNCHER_SCRIPT_KEY = "launcher.py"
WARM_HOOK_KEY = "warm_hook.py"
ANNOTATION_LAUNCHER = f"{GROUP}/launcher"
# On a pod whose trainer runs in the warm launcher: the port of the agent that reports it.
ANNOTATION_WARM_AGENT_PORT = f"{GROUP}/warm-agent-port"
# The coscheduling plugin groups pods by this label (gang scheduling, gang.py).
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"
# Kueue queues a job by this label (its LocalQueue's name): reconcile/queueing.py, the client.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FINALIZER = f"{GROUP}/finalizer"
# One Lease per namespace with jobs: its holder is the operator instance that acts there.
LEASE_NAME = "multiworker-operator"
# Server-side selector of the pod watch: only pods the operator labelled.
POD_WATCH_SELECTOR = LABEL_JOB_NAME

TRAINER_CONTAINER = "tensorflow"
CHECKPOINT_VOLUME = "mwj-checkpoint"
MAX_DNS_LABEL = 63
_WORKER_INFIX = "-worker-"
# Characters left for the job name plus the largest worker index in a pod hostname.
NAME_AND_INDEX_BUDGET = MAX_DNS_LABEL - len(_WORKER_INFIX)
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# One environment string (TF_CONFIG=...) may hold at most MAX_ARG_STRLEN bytes (32 pages of
# 4 KiB on Linux): a longer one makes execve fail, so no worker could ever start.
MAX_ENV_STRING = 131072
# TF_CONFIG lists every worker's address. Per worker at most: 2 quotes and a comma, the job
# name twice, "-worker-", the index, ".", ".", a namespace of 63, ".svc", ":" and a 5-digit
# port; around the list at most this much ("TF_CONFIG=", the JSON around it, the task, NUL).
TF_CONFIG_PER_WORKER = 3 + len(_WORKER_INFIX) + 2 + MAX_DNS_LABEL + len(".svc") + 1 + 5
TF_CONFIG_AROUND = 100


def service_name(job: str) -> str:
    """The headless Service that gives every worker a stable DNS name."""
    return job


def worker_name(job: str, index: int) -> str:
    """The pod name of worker `index`; also its hostname inside the Service's subdomain."""
    return f"{job}{_WORKER_INFIX}{index}"


def worker_hostname(job: str, namespace: str, index: int) -> str:
    """The DNS name peers use to reach worker `index`."""
    return f"{worker_name(job, index)}.{service_name(job)}.{namespace}.svc"


def worker_address(job: str, namespace: str, index: int, port: int) -> str:
    return f"{worker_hostname(job, namespace, index)}:{port}"


def cluster_config_name(job: str, job_uid: str, workers: int, port: int, shipped: str) -> str:
    """The job's ConfigMap holding every worker's address (TF_CONFIG's cluster) and what the
    operator ships to the pods (`shipped`: a digest of it, e.g. the agent's script). Its name
    tells what it holds, so an existing one is the right one and the operator never needs to
    read or rewrite a ConfigMap; an operator that ships something else (an upgrade) gives new
    groups a new one."""
    digest = hashlib.sha256(f"{job_uid}/{workers}/{port}/{shipped}".encode()).hexdigest()[:10]
    return f"{job}-tf-{digest}"


CLUSTER_CONFIG_KEY = "workers"


def config_map_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    return f"{path}/{name}" if name else path


def agent_key_name(job: str, job_uid: str) -> str:
    """The job's Secret holding the key its in-place agents check the operator's notes with
    (reconcile/agent_keys.py). The uid in its name: a Secret left by an earlier job of the
    same name is never taken for this one's."""
    return f"{job}-agent-key-{job_uid[:8]}"


def secret_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{path}/{name}" if name else path


def network_policy_name(job: str) -> str:
    """The job's NetworkPolicy (--worker-network-policy): who may reach its workers."""
    return f"{job}-workers"


def network_policy_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    return f"{path}/{name}" if name else path


OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "multiworker-operator"}  # the chart's pods


def job_selector(job: str) -> dict[str, str]:
    """Selects every pod of the job, whatever its generation (the Service uses it too)."""
    return {LABEL_JOB_NAME: job}


def worker_labels(job: str, index: int, generation: int) -> dict[str, str]:
    return {
        LABEL_JOB_NAME: job,
        LABEL_WORKER_INDEX: str(index),
        LABEL_GROUP_GENERATION: str(generation),
    }


def checkpoint_subdir(namespace: str, job: str, uid: str) -> str:
    """The job's own checkpoint directory, relative to the claim's mount path. The uid makes a
    job deleted and applied again under the same name a different directory (it starts afresh
    instead of restoring the old run); namespace and name keep it findable by eye."""
    return f"{namespace}/{job}-{uid}"


def job_path(namespace: str, name: str | None = None) -> str:
    """REST path of a job (or, without a name, of the namespace's jobs)."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{path}/{name}" if name else path


def label_selector(labels: dict[str, str]) -> str:
    """Render labels as a Kubernetes label selector string."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def name_problems(job: str, workers: int) -> list[str]:
    """Every reason `job` with `workers` workers would produce an invalid generated name.

    The job name is the Service name (a DNS-1035 label) and the prefix of every pod hostname
    (a DNS label of at most 63 characters), so it is the *longest* hostname that counts.
    """
    problems = []
    if not _DNS_1035_LABEL.match(job):
        problems.append(
            f"metadata.name: {job!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter): it names the job's headless Service"
        )
    longest = worker_name(job, max(workers, 1) - 1)
    if len(longest) > MAX_DNS_LABEL:
        problems.append(
            f"metadata.name: worker hostname {longest!r} is {len(longest)} characters, "
            f"more than {MAX_DNS_LABEL}; shorten the name or use fewer workers"
        )
    if tf_config_bound(job, workers) > MAX_ENV_STRING:
        problems.append(
            f"spec.workers: TF_CONFIG for {workers} workers named {job!r} may take "
            f"{tf_config_bound(job, workers)} bytes, more than the {MAX_ENV_STRING} one "
            "environment variable may hold; shorten the name or use fewer workers"
        )
    return problems


def tf_config_bound(job: str, workers: int) -> int:
    """An upper bound on the bytes of `TF_CONFIG=<json>` for any namespace and port: what the
    CRD's CEL rule computes too (it cannot see the namespace)."""
    index_digits = len(str(max(workers, 1) - 1))
    return workers * (2 * len(job) + index_digits + TF_CONFIG_PER_WORKER) + TF_CONFIG_AROUND
