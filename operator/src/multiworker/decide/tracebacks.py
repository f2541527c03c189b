"""What a failed trainer's last output says went wrong: the exception and where it was raised,
with data dumps elided; its shape, to tell the same failure in the next group; a hint for
causes we know.

No I/O. The input is a termination message: the runtime's own words, or — under
FallbackToLogsOnError — the log's last 2,048 bytes, where a Python traceback may begin
before the cut and an exception's message may hold a NumPy array or a tensor spanning dozens
of lines (Keras 3's error under MultiWorkerMirroredStrategy prints the batch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Python prints an uncaught exception as `Type: message` at the start of a line, after the
# frames; a dotted module path may precede the name (tensorflow.python.framework.errors_impl).
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Iteration))"
    r"(?::\s?(?P<message>.*))?$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_TRACEBACK = "Traceback (most recent call last):"
_OPEN, _CLOSE = "([{", ")]}"
ELIDED = "…"
GROUP_CHARS = 160  # a bracketed part longer than this (or over lines) is data, not words
MESSAGE_CHARS = 300  # of the exception's message, after elision
# Frames of installed packages: the innermost one shows where the error surfaced, the
# script's own innermost one which of its lines led there.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3[.\d]*/")
# Errors a worker gets when a peer or the network failed, not its own code: never a
# start-up error of the script, however often they repeat.
_PEER_ERRORS = frozenset({"UnavailableError", "AbortedError", "DeadlineExceededError",
                          "CancelledError"})

# (what the exception line matches, the hint): causes users hit, in their words.
_HINTS = (
    (re.compile(r"PerReplica.*unsupported type|unsupported type.*PerReplica", re.DOTALL),
     "Keras 3's model.fit does not run under MultiWorkerMirroredStrategy: set "
     "TF_USE_LEGACY_KERAS=1 in the training container's env to use Keras 2 (tf-keras, in "
     "the worker images), or train with multiworker.runtime.fit (docs/keras.md)"),
    (re.compile(r"^ModuleNotFoundError"),
     "the image lacks that module: install it in the image, or fix the command's PYTHONPATH"),
    (re.compile(r"^(FileNotFoundError|.*No such file or directory)"),
     "a path the script reads is not in the container: check the command, the image and "
     "the volumes"),
)


@dataclass(frozen=True)
class ScriptError:
    """The exception a script died of, as a reader wants it."""

    type: str  # the exception's class, without its module
    message: str  # one line, data dumps elided
    frames: tuple[str, ...] = ()  # `File "x.py", line 3, in main`: the script's, the last

    @property
    def line(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type

    def summary(self) -> str:
        """The innermost frames, then the exception line: a traceback's useful end."""
        return "\n".join((*self.frames, self.line))

    def shape(self, exit_code: int | None) -> str:
        """What must match for two failures to be the same one: the exit code, the type and
        the message with its numbers and addresses blanked (ports, pids, times differ)."""
        message = re.sub(r"0x[0-9a-fA-F]+", "0x#", self.message)
        return f"{exit_code}|{self.type}|{re.sub(r'[0-9]+', '#', message)}"

    @property
    def from_peers(self) -> bool:
        """A collective's error: a peer or the network failed, not this script."""
        return self.type in _PEER_ERRORS

    def hint(self) -> str | None:
        return next((hint for pattern, hint in _HINTS if pattern.search(self.line)), None)


def script_error(text: str) -> ScriptError | None:
    """The last exception in `text` with its innermost frames; None when it shows none."""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)), default=0)
    frames: list[str] = []
    found: int | None = None
    for i in range(start, len(lines)):
        if _FRAME.match(lines[i]):
            frames.append(lines[i].strip())
            found = None
        elif found is None and _EXCEPTION.match(lines[i]):
            found = i
    if found is None:
        return None
    match = _EXCEPTION.match(lines[found])
    assert match is not None
    # A message may go on over lines (a tensor's repr): up to the end, where the process died.
    message = "\n".join([match["message"] or "", *lines[found + 1:]]).strip()
    return ScriptError(match["type"].rsplit(".", 1)[-1], _one_line(elide(message)),
                       _shown(frames))


def _shown(frames: list[str]) -> tuple[str, ...]:
    """The script's own innermost frame, then the innermost one if that is a library's."""
    own = [frame for frame in frames if not _LIBRARY.search(frame)]
    shown = ([own[-1]] if own else []) + frames[-1:]
    return tuple(dict.fromkeys(shown))


def readable(text: str, lines: int, chars: int) -> str:
    """What a termination message says went wrong, in a few lines: the exception and where
    it was raised when it holds a traceback, else its last `lines`; data dumps elided."""
    error = script_error(text)
    if error is not None:
        return error.summary()[-chars:]
    kept = "\n".join(text.strip().splitlines()[-lines:])
    return elide(kept)[-chars:]


def elide(text: str) -> str:
    """`text` with each bracketed part that is data — over lines, or longer than GROUP_CHARS
    — shown as (…); a part cut by the start or the end of the text is elided too."""
    out: list[str] = []
    stack: list[int] = []  # where each open bracket's part began in `out`
    for ch in text:
        if ch in _OPEN:
            stack.append(len(out))
            out.append(ch)
        elif ch in _CLOSE and stack and out[stack[-1]] == _OPEN[_CLOSE.index(ch)]:
            begin = stack.pop()
            inner = "".join(out[begin + 1:])
            if "\n" in inner or len(inner) > GROUP_CHARS:
                del out[begin + 1:]
                out.append(ELIDED)
            out.append(ch)
        elif ch in _CLOSE and not stack:  # its opening was cut off with the output's head
            out = [ELIDED]
        else:
            out.append(ch)
    if stack:  # opened and never closed: cut off with the end
        del out[stack[0] + 1:]
        out.append(ELIDED)
    return "".join(out)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + ELIDED
