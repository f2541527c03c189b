"""Runtime tier: real TensorFlow workers as subprocesses on loopback, no cluster.

`launcher` starts `examples/training/train.py` workers (see workers.py); every process still
alive at teardown is continued and killed, and a failed test prints the workers' log tails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.workers import Launcher


@pytest.fixture
def launcher(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.cleanup()
    if getattr(getattr(request.node, "rep_call", None), "failed", False):
        print(launcher.logs())


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Measurements, listed after the results with every tier's figures (tests/conftest.py):
    printed from a pytest-xdist worker, they would be lost."""

    def emit(message: str) -> None:
        request.node.user_properties.append(("figure: runtime", message))

    yield emit
