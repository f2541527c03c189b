"""Every error the client raises: one base, `ClientError`, whose message is one line that says
what went wrong and what to do. `kubectl mwj` turns each class into its own exit code
(plugin.EXIT_CODES), so a script can tell a failed job from a typo from a cluster that is down.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Something the client could not do; the message is meant for a person, on one line."""


class InvalidJob(ClientError):
    """The job was refused before it ran: a field our checks or the API server rejected, a
    claim that does not exist, a name already taken, a file that cannot be read."""


class JobNotFound(ClientError):
    """No job of that name in the namespace (or it was deleted while we waited)."""


class ClusterUnreachable(ClientError):
    """No cluster to talk to: no kubeconfig, an unknown context, or a server that does not
    answer."""


class ApiError(ClientError):
    """The API server refused a request for another reason than the job's content: forbidden,
    the MultiWorkerJob API not installed, a server error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WaitTimeout(ClientError, TimeoutError):
    """The job did not reach the phase waited for in time; it keeps running."""


class JobFailed(ClientError):
    """The job ended Failed while something else was waited for. `reason` and `message` are
    its Failed condition's; `last_failure` is status.lastFailure as stored (or None)."""

    def __init__(self, job: str, reason: str, message: str,
                 last_failure: dict[str, Any] | None) -> None:
        self.job, self.reason, self.message, self.last_failure = \
            job, reason, message, last_failure
        said = f"job {job} failed: {reason}: {message}" if reason else f"job {job} failed"
        if last_failure:
            said += f" (last failure: {describe_failure(last_failure)})"
        super().__init__(said)


def describe_failure(failure: dict[str, Any]) -> str:
    """status.lastFailure in words: `worker-1 exited 137 (OOMKilled) in generation 2`."""
    code = failure.get("exitCode")
    how = f"exited {code} ({failure.get('reason')})" if code is not None \
        else str(failure.get("reason", "failed"))
    return f"worker-{failure.get('worker')} {how} in generation {failure.get('generation')}"
