"""Leaving the process with a contract exit code, without TF's teardown.

After a collective abort or a missing peer, TF's exit path (coordination-service shutdown
barrier, gRPC teardown) waits for peers that are gone: measured at up to 20 s extra with the
leader stopped. The operator reads the exit code to decide on a restart, so exit promptly.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flushes logs and output, then ends the process immediately with `code`."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
