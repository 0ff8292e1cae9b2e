"""The store contract (relay_jupyter/testing/store_contract.py) on the PostgreSQL store: a fresh
database per test in the session's throwaway cluster, and a second store object on the same
database as the second broker (``make_peer``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay_jupyter.testing.store_contract import DAY, ContractClock, HeldElsewhere, StoreContract, spawn_hold_worker

pytestmark = pytest.mark.pg

pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.storage.postgres import PostgresStore  # noqa: E402


@pytest.fixture
def _opened() -> Iterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    yield opened
    for s in opened:
        s.close()


@pytest.fixture
def make_store(postgres_db: tuple[str, Path], _opened: list[PostgresStore]
               ) -> Callable[[ContractClock], PostgresStore]:
    url, password_file = postgres_db

    def make(clock: ContractClock) -> PostgresStore:
        _opened.append(PostgresStore.open(url, password_file=password_file, clock=clock))
        return _opened[-1]

    return make


@pytest.fixture
def make_peer(postgres_db: tuple[str, Path], _opened: list[PostgresStore]
              ) -> Callable[[PostgresStore, ContractClock], PostgresStore]:
    url, password_file = postgres_db

    def make(store: PostgresStore, clock: ContractClock) -> PostgresStore:
        _opened.append(PostgresStore.open(url, password_file=password_file, clock=clock))
        return _opened[-1]

    return make


@pytest.fixture
def spawn_holder(postgres_db: tuple[str, Path], _opened: list[PostgresStore]
                 ) -> Callable[[PostgresStore], HeldElsewhere]:
    """Per-user brokers sharing the database (docs/multi-user.md, deployment 2): alice's broker, in a
    process of its own, holds 7 tokens / $0.5 of the team ``ml`` (a hold in the shared schema; its
    lease in alice's schema); bob's broker is the judge."""
    url, password_file = postgres_db

    def spawn(store: PostgresStore) -> HeldElsewhere:
        bob = PostgresStore.open(url, password_file=password_file, namespace="bob")
        _opened.append(bob)
        bob.acquire_lease()
        proc = spawn_hold_worker(["pg", url, str(password_file), "alice", "team:ml", DAY, "7", "0.5"])
        return HeldElsewhere(proc, bob, "team:ml", DAY, 7, 0.5)

    return spawn


class TestPostgresStore(StoreContract):
    pass
