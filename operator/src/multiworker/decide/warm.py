"""Whether a training container can start its trainers from a warm spare interpreter
(pod/launcher.py), and how its command line is wrapped to do so.

The launcher runs the very command line the user wrote, in a Python process started ahead of
time that has already imported the job's warmModules; it can only do that for a command line
it understands: a Python interpreter running a script, a module (-m) or code (-c), with the
interpreter options that leave the environment and `site` working (the spare's hook is a
sitecustomize on PYTHONPATH). Anything else keeps today's cold restart, with the reason.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Options that change nothing the spare relies on; those taking a value take the next word.
_PLAIN_OPTIONS = frozenset({"-u", "-B", "-O", "-OO", "-q", "-b", "-bb", "-d", "-v", "-R", "-s",
                            "-P"})
_VALUE_OPTIONS = frozenset({"-X", "-W"})
# Options under which the spare's hook would not run (no PYTHONPATH, no site).
_BLOCKING_OPTIONS = {"-E": "ignores PYTHONPATH", "-I": "ignores PYTHONPATH",
                     "-S": "skips the site module"}


@dataclass(frozen=True)
class WarmCommand:
    """The user's Python command line, and where it was written (`command`, or `args` after
    the image's entrypoint, which is kept)."""

    argv: tuple[str, ...]
    field: str  # "command" or "args"

    @property
    def interpreter(self) -> str:
        return self.argv[0]


def warm_command(container: Mapping[str, Any]) -> WarmCommand | str:
    """The training container's command line as the launcher can run it, or why it cannot."""
    command, args = container.get("command") or [], container.get("args") or []
    argv = [*command, *args] if command else list(args)
    field = "command" if command else "args"
    if not argv:
        return "the training container sets neither command nor args (the image's own runs)"
    why = _why_not_python(argv)
    return why if why is not None else WarmCommand(tuple(str(a) for a in argv), field)


def _why_not_python(argv: Sequence[str]) -> str | None:
    if not _PYTHON.match(posixpath.basename(argv[0])):
        return f"its command runs {argv[0]!r}, not a Python interpreter"
    rest = list(argv[1:])
    while rest:
        word = rest.pop(0)
        if word in ("-m", "-c"):
            return None if rest else f"python {word} names nothing to run"
        if word in _PLAIN_OPTIONS:
            continue
        if word in _VALUE_OPTIONS:
            if not rest:
                return f"python {word} lacks its value"
            rest.pop(0)
            continue
        if word in _BLOCKING_OPTIONS:
            return (f"python {word} {_BLOCKING_OPTIONS[word]}: a spare interpreter could not "
                    "be prepared")
        if word == "-" or word.startswith("-"):
            return f"python option {word!r} is not one the launcher understands"
        return None  # the script; what follows is its own
    return "python is started without a script, module or code (it would read stdin)"
