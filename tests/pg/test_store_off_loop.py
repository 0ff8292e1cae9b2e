"""Store calls off the broker's event loop (issues 12 and 18), through a real ``jupyter relay serve``.

PostgreSQL: a raw psycopg connection holds the row lock of origin A's day in the budget ledger (what
another broker's reservation holds while it checks the day). A's run then waits in its reservation
(seen in ``pg_stat_activity``: a backend of the relay database waiting on a Lock); meanwhile origin
B's run on the same daemon streams to its end (its origin row and the team row are free), and
``readyz`` and an RPC answer. When the lock goes, A's run ends ``done`` too: one terminal event each.
With the reservation on the loop, B's ``run.start`` could not even be answered until A's statement
timed out (15 s), and A's run would then end ``STORAGE_ERROR``.

SQLite: a second connection's ``BEGIN IMMEDIATE`` holds the database's write lock, so the daemon's
journal write of a new run waits (``busy_timeout``). While it waits (the run is registered in the
daemon's run manager, shown by the ``relay_active_runs`` gauge of ``/metrics``, which reads no store),
``readyz`` answers; released, the ``run.start`` returns its run and the run ends ``done``. With the
journal write on the loop, nothing would answer until the busy timeout (5 s) failed the start.

No assertion is on time: each checks what happened, in which order."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.testing import FakeAnthropic, Reply, text

pytestmark = [pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_harness import Daemon, start_daemon, wait_for  # noqa: E402

KEY = "sk-ant-test-offloop-0123456789"
ANSWER = " ".join(f"word{i}" for i in range(120))
TERMINAL = {"run.done", "run.cancelled", "run.error", "run.budget_exhausted", "run.interrupted"}


def _grant(origin: str) -> Grant:
    return Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id=f"c-{origin}",
                 budget=Budget(requests_per_minute=None, tokens_per_day=10_000_000, cost_per_day_usd=None))


def _start(root: Path, fake: FakeAnthropic, **extra: Any) -> Daemon:
    ensure_private_dir(root / "sock")
    cfg = root / "broker.json"
    cfg.write_text(json.dumps({"data_dir": str(root / "relay"), "anthropic_base_url": fake.base_url,
                               "anthropic_api_key": KEY, "default_model": "claude-test-1", **extra}))
    return start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock", "--config", str(cfg))


def _rpc(daemon: Daemon, client: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        return conn.rpc(method, params, {"X-Relay-Client": client})
    finally:
        conn.close()


def _get(daemon: Daemon, path: str) -> tuple[int, bytes]:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        status, _, body, _ = conn.request("GET", path)
        return status, body
    finally:
        conn.close()


def _state(daemon: Daemon, client: str, run_id: str) -> str:
    return _rpc(daemon, client, "runs.get", {"run_id": run_id})["result"]["run"]["state"]


def _terminals(daemon: Daemon, client: str, run_id: str) -> list[str]:
    """The run's stored terminal events, read back from the daemon's event stream (replay from 0)."""
    conn = daemon.connect()
    conn.sock.settimeout(30)
    try:
        conn.send("GET", "/relay/events?since=0", {"X-Relay-Client": client})
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.sock.recv(65536)
        found: list[str] = []
        while True:  # replay first, then the live part: stop at the run's terminal event
            frames = data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")
            found = [json.loads(line[6:])["type"] for line in frames.splitlines() if line.startswith("data: ")
                     and json.loads(line[6:]).get("run_id") == run_id
                     and json.loads(line[6:])["type"] in TERMINAL]
            if found:
                return found
            data += conn.sock.recv(65536)
    finally:
        conn.close()


def _start_run(daemon: Daemon, client: str, conversation: str, out: dict[str, Any]) -> threading.Thread:
    def go() -> None:
        out[client] = _rpc(daemon, client, "run.start", {"conversation": conversation, "prompt": "hello"})

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def _active_runs(daemon: Daemon) -> float:
    status, body = _get(daemon, "/relay/metrics")
    assert status == 200, body[:200]
    for line in body.decode().splitlines():
        if line.startswith("relay_active_runs "):
            return float(line.split()[1])
    raise AssertionError("relay_active_runs is not in /metrics")


@pytest.mark.pg
def test_a_reservation_waiting_on_a_row_lock_stalls_only_its_own_run(postgres_db, tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    import psycopg

    from relay_jupyter.storage.postgres import PostgresStore, schema_for

    url, password_file = postgres_db
    with PostgresStore.open(url, password_file=password_file, namespace="alice") as store:
        book = GrantBook(store)
        for client in ("a", "b"):
            book.issue(_grant(f"daemon:{client}"))
    password = password_file.read_text().strip()
    day = datetime.now(UTC).date().isoformat()
    with FakeAnthropic(api_key=KEY, default=Reply(text(ANSWER), chunk_tokens=2)) as fake:
        daemon = _start(tmp_path, fake, store_url=url, store_password_file=str(password_file), user="alice",
                        teams={"ml": {"members": ["alice"], "tokens_per_day": 10_000_000}})
        try:
            _row_lock_probe(daemon, url, password, day, fake, psycopg, schema_for("alice"))
        finally:
            daemon.stop()


def _row_lock_probe(daemon: Daemon, url: str, password: str, day: str, fake: FakeAnthropic, psycopg: Any,
                    schema: str) -> None:
    locker = psycopg.connect(url, password=password, autocommit=False)
    watcher = psycopg.connect(url, password=password, autocommit=True)
    try:
        # the row lock another broker's reservation of A's day would hold while it checks that day
        locker.execute(f"INSERT INTO {schema}.ledger AS l (origin, day) VALUES (%s, %s) "
                       "ON CONFLICT (origin, day) DO UPDATE SET tokens = l.tokens", ("daemon:a", day))

        def a_waits() -> bool:
            rows = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND wait_event_type = 'Lock' AND pid <> %s",
                                   (locker.info.backend_pid,)).fetchone()
            return bool(rows and rows[0] >= 1)

        started: dict[str, Any] = {}
        _start_run(daemon, "a", "conv-a", started).join(60)
        run_a = started["a"]["result"]["run_id"]
        wait_for(a_waits, timeout=30, what="A's reservation to wait on the locked budget row")

        # B, on the same daemon, runs to its end while A's reservation waits
        _start_run(daemon, "b", "conv-b", started).join(60)
        assert "result" in started["b"], started["b"]
        run_b = started["b"]["result"]["run_id"]
        wait_for(lambda: _state(daemon, "b", run_b) != "running", timeout=60, what="B's run to end")
        assert _state(daemon, "b", run_b) == "done"
        status, body = _get(daemon, "/relay/readyz")
        assert status == 200, body
        # ... and A is still waiting on the lock: all of that happened during its wait
        assert a_waits()
        assert _state(daemon, "a", run_a) == "running"
        conv = _rpc(daemon, "b", "conversations.list", {})["result"]["conversations"]
        assert any(c["message_count"] == 2 for c in conv), conv  # B's prompt and its whole answer stored
    finally:
        locker.rollback()
        locker.close()
        watcher.close()
    wait_for(lambda: _state(daemon, "a", run_a) != "running", timeout=60, what="A's run to end")
    assert _state(daemon, "a", run_a) == "done"  # its reservation went through once the lock was gone
    assert _terminals(daemon, "a", run_a) == ["run.done"]
    assert _terminals(daemon, "b", run_b) == ["run.done"]
    assert len(fake.requests) == 2


def test_a_journal_write_waiting_for_the_sqlite_lock_leaves_the_daemon_answering(tmp_path: Path) -> None:
    from relay_jupyter.storage.sqlite import Store

    ensure_private_dir(tmp_path / "relay")
    with Store.open(tmp_path / "relay" / "relay.db") as store:
        GrantBook(store).issue(_grant("daemon:a"))
    with FakeAnthropic(api_key=KEY, default=Reply(text(ANSWER), chunk_tokens=2)) as fake:
        daemon = _start(tmp_path, fake)
        try:
            assert _active_runs(daemon) == 0
            locker = sqlite3.connect(tmp_path / "relay" / "relay.db", isolation_level=None, timeout=10)
            started: dict[str, Any] = {}
            try:
                locker.execute("BEGIN IMMEDIATE")  # another writer holds the database's write lock
                thread = _start_run(daemon, "a", "conv-a", started)
                # registered in the run manager, so its journal write has been handed over and is waiting
                wait_for(lambda: _active_runs(daemon) == 1, timeout=30, what="the run to be registered")
                status, body = _get(daemon, "/relay/readyz")
                assert status == 200, body
                assert thread.is_alive() and not started  # run.start still waits for its journal write
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            thread.join(60)
            assert "result" in started["a"], started["a"]  # the write went through once the lock was gone
            run_a = started["a"]["result"]["run_id"]
            wait_for(lambda: _state(daemon, "a", run_a) != "running", timeout=60, what="the run to end")
            assert _state(daemon, "a", run_a) == "done"
            assert _terminals(daemon, "a", run_a) == ["run.done"]
        finally:
            daemon.stop()
