"""``query_telemetry(origin_prefix=...)`` on every store (the in-memory reference, SQLite, PostgreSQL): the prefix
is applied in the store's query, before the limit, so the newest ``limit`` rows are the newest *matching* ones
however many rows of other origins are newer (the hub panel's ``telemetry.query``: docs/telemetry.md). A prefix
is a prefix: LIKE's wildcards and quotes in it match themselves only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.core.telemetry import TelemetryRow
from relay_jupyter.storage import Store

A, A_DIR, A_LOOKALIKE, B = ("user:alice/notebook:a.ipynb", "user:alice/notebook:reports/q4.ipynb",
                            "user:alicex/notebook:a.ipynb", "user:bob/notebook:b.ipynb")


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def store(request, tmp_path: Path) -> Iterator[object]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "sqlite":
        opened = Store.open(tmp_path / "relay.db")
    else:
        pytest.importorskip("psycopg", reason="psycopg is not installed")
        from relay_jupyter.storage.postgres import PostgresStore

        url, password_file = request.getfixturevalue("postgres_db")
        opened = PostgresStore.open(url, password_file=password_file)
    try:
        yield opened
    finally:
        opened.close()


def _row(origin: str, ts: float) -> TelemetryRow:
    return TelemetryRow(ts=ts, origin=origin, source="proxy", model="claude-test-1", input_tokens=1)


def test_the_prefix_is_applied_before_the_limit(store) -> None:
    mine = [store.record_telemetry(_row(o, ts)) for o, ts in ((A, 1.0), (A_DIR, 2.0), (A_LOOKALIKE, 3.0))]
    for n in range(60):  # newer rows of another user
        store.record_telemetry(_row(B, 10.0 + n))
    assert store.query_telemetry(origin_prefix="user:alice/", limit=5) == mine[:2]
    assert store.query_telemetry(origin_prefix="user:alice/", limit=1) == mine[1:2]  # the newest matching one
    assert store.query_telemetry(origin_prefix="user:alice/notebook:reports/") == mine[1:2]
    assert store.query_telemetry(origin_prefix="user:alice") == mine  # a plain prefix: the look-alike too
    assert store.query_telemetry(origin_prefix="user:alice/", since=1.5) == mine[1:2]
    assert store.query_telemetry(origin=A, origin_prefix="user:alice/") == mine[:1]
    assert store.query_telemetry(origin=A, origin_prefix="user:bob/") == []
    assert len(store.query_telemetry(origin_prefix="user:bob/", limit=1000)) == 60
    assert store.query_telemetry(limit=5) == store.query_telemetry(origin_prefix="user:bob/", limit=5)
    for wild in ("user:%/", "user:_lice/", "%", "user:alice/' OR '1'='1"):
        assert store.query_telemetry(origin_prefix=wild) == [], wild
    for bad in ("", "a\x00b"):
        with pytest.raises(ValueError):
            store.query_telemetry(origin_prefix=bad)
