"""The store contract (relay_jupyter/testing/store_contract.py) on the PostgreSQL store: a fresh
database per test in the session's throwaway cluster, and a second store object on the same
database as the second broker (``make_peer``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay_jupyter.testing.store_contract import ContractClock, StoreContract

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


class TestPostgresStore(StoreContract):
    pass
