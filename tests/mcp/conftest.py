"""Fixtures of the MCP tests: a notes directory for the test server's write tools, a Store for pins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes"
    path.mkdir()
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[object]:
    from relay_jupyter.storage.sqlite import Store

    s = Store.open(tmp_path / "relay.db")
    try:
        yield s
    finally:
        s.close()
