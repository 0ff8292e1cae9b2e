"""Fixtures for the storage tests: a store on a temporary file with a settable clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_jupyter.storage import Store


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "relay.db"


@pytest.fixture
def store(db_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(db_path, clock=clock)
    yield s
    s.close()
