"""Leaving the process with a contract exit code, without TF's teardown, and saying why.

After a collective abort or a missing peer, TF's exit path (coordination-service shutdown
barrier, gRPC teardown) waits for peers that are gone: measured at up to 20 s extra with the
leader stopped. The operator reads the exit code to decide on a restart, so exit promptly.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import NoReturn

# Where the kubelet mounts the container's termination message file (the default
# terminationMessagePath); its content becomes the pod's termination message, which the
# operator shows in status.lastFailure and its Events. Absent outside Kubernetes.
TERMINATION_LOG = "/dev/termination-log"
_MAX_MESSAGE_BYTES = 4096  # the kubelet keeps no more
# How long a worker that leaves on its own decision (exit 2, 5, 143) keeps serving its peers: its
# part of the last all-reduce is done, yet a peer may still be reading its buffer. Leaving at
# once closed that socket and the peer exited 4 instead of with the group's code (CI, under
# load). The reads take milliseconds.
PEERS_LAST_READ_SECONDS = 2.0


def exit_now(code: int, linger_seconds: float = 0.0) -> NoReturn:
    """Flushes logs and output, then ends the process with `code` — after `linger_seconds`,
    during which TensorFlow's server still answers the peers."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    if linger_seconds > 0:
        time.sleep(linger_seconds)
    os._exit(code)


def write_termination_message(message: str, path: str | None = None) -> bool:
    """Makes `message` the termination message, so it reaches the job's status even under
    `terminationMessagePolicy: File` and ahead of any log noise; False where there is no file."""
    path = path or TERMINATION_LOG
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "wb") as file:
            cut = message.encode()[:_MAX_MESSAGE_BYTES]
            file.write(cut.decode(errors="ignore").encode())  # no half a character at the end
    except OSError:
        return False
    return True
