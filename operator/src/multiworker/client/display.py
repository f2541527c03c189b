"""How `Job.follow` shows progress: a tqdm bar when tqdm is installed (in a notebook, its
widget), plain lines otherwise. tqdm is optional: the client never depends on it."""

from __future__ import annotations

import importlib
from typing import Any, Protocol, TextIO

from multiworker.client.progress import ProgressUpdate


class Display(Protocol):
    def show(self, update: ProgressUpdate) -> None: ...

    def close(self) -> None: ...


class Lines:
    """One line per change."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, update: ProgressUpdate) -> None:
        print(update, file=self.out, flush=True)

    def close(self) -> None:
        pass


class Bar:
    """A tqdm bar counting the chief's steps, with the phase, generation and loss beside it."""

    def __init__(self, tqdm: Any, out: TextIO) -> None:
        self.bar = tqdm(total=None, unit="step", file=out, dynamic_ncols=True)

    def show(self, update: ProgressUpdate) -> None:
        self.bar.set_description(f"{update.phase or 'Pending'} gen {update.generation}")
        extra = {"ready": update.ready, "epoch": update.epoch,
                 "loss": None if update.loss is None else f"{update.loss:.4g}"}
        self.bar.set_postfix({k: v for k, v in extra.items() if v is not None}, refresh=False)
        self.bar.n = update.step or 0
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def display(progress_bar: bool, out: TextIO) -> Display:
    if progress_bar:
        try:
            return Bar(importlib.import_module("tqdm.auto").tqdm, out)
        except ImportError:
            pass
    return Lines(out)
