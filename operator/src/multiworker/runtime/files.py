"""The small JSON files the runtime keeps beside checkpoints (job.json, fence.json, markers).

Other workers, on other nodes, read them while they are being replaced, so each is written to
a temp file in the same directory, flushed to the storage, then renamed over the old one: a
reader or a crash sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

# Like the checkpoints TensorFlow writes: workers of one job may run as different users.
FILE_MODE = 0o644


def write_json(path: str, document: Any) -> None:
    """Writes `document` to `path` atomically, creating the directories it needs."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(document, file)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def read_json(path: str) -> Any:
    """The document at `path`; raises OSError (absent, unreadable) or ValueError (garbled)."""
    with open(path, encoding="utf-8") as file:
        return json.load(file)
