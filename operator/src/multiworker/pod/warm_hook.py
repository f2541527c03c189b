"""The hook of a warm launcher's spare interpreter (launcher.py), shipped as sitecustomize.py
on the spare's PYTHONPATH: Python runs it at start-up, before the user's script, module or
code, so the spare runs the user's own command line (the same /proc cmdline, sys.argv,
sys.path and __main__ as a cold start) with the heavy imports already done.

It imports MWJ_LAUNCHER_PRELOAD, says "ready" on the status pipe, and blocks until the launcher
sends the generation's environment on the command pipe (or closes it: the spare is not
needed). Then the environment is replaced (putenv: C code sees it too), the hook leaves
sys.path, the image's own sitecustomize (if any) runs as it would have, and Python goes on to
run the user's program. Without MWJ_WARM_FDS (a cold start, a child of the trainer) it does
nothing but that last step.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys

FDS = "MWJ_WARM_FDS"  # "<status fd>,<command fd>", launcher.py's
PRELOAD = "MWJ_LAUNCHER_PRELOAD"  # contract.MWJ_LAUNCHER_PRELOAD
FAILED_EXIT = 70


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _wait_for_go() -> None:
    status_fd, command_fd = (int(fd) for fd in os.environ[FDS].split(","))
    try:
        for module in filter(None, os.environ.get(PRELOAD, "").split(",")):
            importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001 (anything a module's import raises)
        os.write(status_fd, f"failed importing {module}: {type(e).__name__}: {e}\n".encode())
        os._exit(FAILED_EXIT)
    os.write(status_fd, b"ready\n")
    raw = _read_all(command_fd)
    if not raw:
        os._exit(0)  # closed without a go: the spare is not needed
    go = json.loads(raw)
    os.close(status_fd)
    os.close(command_fd)
    os.environ.clear()
    os.environ.update(go["env"])


def _run_the_image_hook() -> None:
    """The image's own sitecustomize, which ours hid by coming first on sys.path."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get(FDS):
    _wait_for_go()
_run_the_image_hook()
