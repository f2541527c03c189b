"""Failures the runtime turns into the exit codes of docs/contracts.md.

Each failure carries its exit code so that one place (`run`) maps exceptions to process exits,
and the functions that detect problems stay ordinary raising code that tests can call.
"""

from __future__ import annotations

from multiworker.api.contract import ExitCode

__all__ = [
    "CollectiveAborted",
    "ConfigError",
    "ExitCode",
    "PeersUnreachable",
    "Preempted",
    "RuntimeFailure",
    "Superseded",
]


class RuntimeFailure(Exception):
    """A failure the contract gives its own exit code."""

    exit_code: ExitCode


class ConfigError(RuntimeFailure):
    """The injected environment is malformed; retrying the same pod cannot help."""

    exit_code = ExitCode.BAD_CONFIG

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("bad worker configuration: " + "; ".join(self.problems))


class PeersUnreachable(RuntimeFailure):
    """Some peers did not show up within MWJ_PEER_TIMEOUT_SECONDS; the message says how each
    one failed (name, refused, dropped)."""

    exit_code = ExitCode.PEERS_UNREACHABLE


class CollectiveAborted(RuntimeFailure):
    """A collective failed because a peer died or stopped answering; the group must restart."""

    exit_code = ExitCode.COLLECTIVE_ABORTED


class Preempted(RuntimeFailure):
    """SIGTERM reached the group; every worker checkpointed and stops."""

    exit_code = ExitCode.PREEMPTED


class Superseded(RuntimeFailure):
    """A newer generation of the job claimed MWJ_CHECKPOINT_DIR (fence.py): this trainer's
    group was already replaced, so it stops without saving rather than overwrite the newer
    group's checkpoints."""

    exit_code = ExitCode.SUPERSEDED
