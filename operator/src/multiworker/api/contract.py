"""The names and numbers the operator and the worker runtime must agree on (docs/contracts.md).

One module, stdlib only, imported by both sides: the operator renders these variables and
reads these exit codes, the runtime (`multiworker.runtime`, which imports nothing but the
stdlib and TensorFlow) parses and returns them. A default changed here changes on both sides.
"""

from __future__ import annotations

import enum

# Worker environment (operator -> pod).
TF_CONFIG = "TF_CONFIG"
# Every worker's address, a JSON list, from the job's ConfigMap (names.cluster_config_name):
# TF_CONFIG takes its list from here by the kubelet's $(VAR) expansion, so a pod carries a few
# bytes for it, not the whole group's addresses.
MWJ_WORKER_ADDRESSES = "MWJ_WORKER_ADDRESSES"
MWJ_JOB_NAME = "MWJ_JOB_NAME"
MWJ_JOB_NAMESPACE = "MWJ_JOB_NAMESPACE"
MWJ_JOB_UID = "MWJ_JOB_UID"
MWJ_NUM_WORKERS = "MWJ_NUM_WORKERS"
MWJ_MAX_WORKERS = "MWJ_MAX_WORKERS"  # spec.workers, where spec.elastic may make a group smaller
MWJ_ELASTIC_BATCH = "MWJ_ELASTIC_BATCH"  # spec.elastic.batch: KeepGlobal or ScaleLearningRate
MWJ_WORKER_INDEX = "MWJ_WORKER_INDEX"
MWJ_RESTART_COUNT = "MWJ_RESTART_COUNT"
MWJ_CHECKPOINT_DIR = "MWJ_CHECKPOINT_DIR"
MWJ_RESUME_FROM_DIR = "MWJ_RESUME_FROM_DIR"
MWJ_PROGRESS_PORT = "MWJ_PROGRESS_PORT"
MWJ_PEER_TIMEOUT_SECONDS = "MWJ_PEER_TIMEOUT_SECONDS"
MWJ_COLLECTIVE_TIMEOUT_SECONDS = "MWJ_COLLECTIVE_TIMEOUT_SECONDS"
# The node the pod runs on (the downward API's spec.nodeName): named in the runtime's words
# when a checkpoint volume is not shared between nodes.
MWJ_NODE_NAME = "MWJ_NODE_NAME"
# Pods restarted in place (spec.restartPolicy.mode InPlace): a file that holds the pod's
# generation as it is now (its label, through a downwardAPI volume). A trainer stopped while it
# is higher than MWJ_RESTART_COUNT was superseded by an in-place restart of its broken group:
# there is nothing to checkpoint together, so the runtime exits at once.
MWJ_POD_GENERATION_FILE = "MWJ_POD_GENERATION_FILE"
# "0": when a peer dies, the survivors do not save their replicas (runtime/survivors.py); the
# next group resumes from the periodic checkpoint. Unset: they do.
MWJ_SURVIVOR_SAVES = "MWJ_SURVIVOR_SAVES"
# How a survivor's termination message says it saved its replica (the operator reads the step).
SURVIVOR_SAVED = "saved this survivor's state at step"
# Never set by the operator: every worker's progress port, by index, for groups whose workers
# share one host (tests, a laptop). Unset: each peer serves on MWJ_PROGRESS_PORT.
MWJ_PROGRESS_PORTS = "MWJ_PROGRESS_PORTS"
# Never set by the operator: a JSON object replacing fields of the fingerprint this worker
# reports to its peers, so tests can stage a skewed group with one TensorFlow install.
MWJ_TEST_FINGERPRINT_OVERRIDE = "MWJ_TEST_FINGERPRINT_OVERRIDE"

DEFAULT_PROGRESS_PORT = 8471
# Where a pod's in-place restart agent listens for the operator's word of a new generation
# (spec.restartPolicy.agentPort; pod/notes.py).
DEFAULT_AGENT_PORT = 8472
AGENT_NOTE_PATH = "/generation"
# Where the operator long-polls a pod's agent for its warm launcher's report (pod/launcher.py).
AGENT_TRAINER_PATH = "/trainer"
# What the operator tells the warm launcher (pod/launcher.py) of a training container it
# wraps: the user's command line, one word a variable (MWJ_LAUNCHER_ARG_0, ...; their number in
# MWJ_LAUNCHER_ARGC: the kubelet expands each word's $(VAR) on its own, as in args), the
# modules its spare interpreters import ahead (comma-separated), and the folder of the hook
# they start with (a sitecustomize).
MWJ_LAUNCHER_ARGC = "MWJ_LAUNCHER_ARGC"
MWJ_LAUNCHER_ARG_PREFIX = "MWJ_LAUNCHER_ARG_"
MWJ_LAUNCHER_PRELOAD = "MWJ_LAUNCHER_PRELOAD"
MWJ_LAUNCHER_HOOK = "MWJ_LAUNCHER_HOOK"
DEFAULT_PEER_TIMEOUT_SECONDS = 300
# Above any legitimate wait between workers (first-step tracing, a checkpoint write).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300

# Worker HTTP endpoints (on MWJ_PROGRESS_PORT).
PROGRESS_PATH = "/progress"
# A worker that exits 0 may leave its last /progress report as its termination message, after
# this prefix: the job's final figures, which a poll may have missed (the last one came before
# the end).
FINAL_REPORT_PREFIX = "final progress: "
PREFLIGHT_PATH = "/preflight"


class ExitCode(enum.IntEnum):
    """Process exit codes of the runtime that the operator acts on ("Runtime exit codes")."""

    DONE = 0
    BAD_CONFIG = 2
    PEERS_UNREACHABLE = 3
    COLLECTIVE_ABORTED = 4
    # A newer generation of the job claimed the checkpoint directory (its fence): this
    # trainer belongs to a group already replaced and stops without saving.
    SUPERSEDED = 5
    PREEMPTED = 143


# Exits that mean "a peer failed", not "this worker failed": a worker that died on its own
# (any other code, or a signal) is the one to blame when both show up together.
PEER_FAILURE_EXIT_CODES = frozenset({ExitCode.PEERS_UNREACHABLE, ExitCode.COLLECTIVE_ABORTED})
