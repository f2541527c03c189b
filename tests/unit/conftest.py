"""The unit tier's shared fixture: the fake API server the client's tests talk to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_client_http import FakeApi, kubeconfig


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    """The fake API server (test_client_http.py), and KUBECONFIG pointing at it."""
    fake = FakeApi()
    fake.start()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", fake.url)))
    yield fake
    fake.stop()
