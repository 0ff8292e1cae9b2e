"""The store contract (relay_jupyter/testing/store_contract.py) against every store of the project:
the in-memory reference and SQLite (a peer: a second Store object on the same file, as a second broker)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay_jupyter.core import memory
from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.storage import Store
from relay_jupyter.testing.store_contract import DAY, ContractClock, HeldElsewhere, StoreContract, spawn_hold_worker


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def make_store(self) -> Callable[[ContractClock], MemoryStore]:
        return lambda clock: MemoryStore(clock)


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Iterator[Callable[[ContractClock], Store]]:
        opened: list[Store] = []

        def make(clock: ContractClock) -> Store:
            opened.append(Store.open(tmp_path / "relay.db", clock=clock))
            return opened[-1]

        yield make
        for s in opened:
            s.close()

    @pytest.fixture
    def make_peer(self, tmp_path: Path) -> Iterator[Callable[[Store, ContractClock], Store]]:
        opened: list[Store] = []

        def make(store: Store, clock: ContractClock) -> Store:
            opened.append(Store.open(store.path, clock=clock))
            return opened[-1]

        yield make
        for s in opened:
            s.close()

    @pytest.fixture
    def spawn_holder(self) -> Callable[[Store], HeldElsewhere]:
        """Another broker process on the same file, holding 7 tokens / $0.5 of ``o``."""
        def spawn(store: Store) -> HeldElsewhere:
            proc = spawn_hold_worker(["sqlite", str(store.path), "o", DAY, "7", "0.5"])
            return HeldElsewhere(proc, store, "o", DAY, 7, 0.5)

        return spawn


def test_the_memory_store_follows_the_protocols_event_names() -> None:
    """core sits below protocol, so core/memory.py repeats these names: they must stay the same."""
    assert memory.TERMINAL_TYPES == TERMINAL_EVENTS
    assert memory.PERMISSION_REQUEST == EventType.PERMISSION_REQUEST
    assert memory.PERMISSION_ENDS == {EventType.PERMISSION_RESOLVED, EventType.PERMISSION_TIMEOUT}
