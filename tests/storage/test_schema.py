"""Versioned schema: a v1 file migrates; a newer file is refused; a failed step keeps the old version."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from relay_jupyter.core.types import Grant
from relay_jupyter.storage import SCHEMA_VERSION, SchemaError, Store
from relay_jupyter.storage.schema import MIGRATIONS, V1_SQL, migrate, schema_version


def _make_v1(path: Path) -> None:
    """A database file as the first release wrote it, with some data in it."""
    conn = sqlite3.connect(path)
    conn.executescript(V1_SQL)
    conn.execute("PRAGMA user_version = 1")
    grant = Grant(origin="o", tools=frozenset({"t"}), consent_id="c")
    conn.execute("INSERT INTO grants VALUES (?, ?, 0)", ("o", grant.model_dump_json()))
    frame = b'id: 1\nevent: t\ndata: {"id":1,"ts":1.0,"type":"t","origin":null,"run_id":null,"data":{"v":1}}\n\n'
    conn.execute("INSERT INTO events (ts, type, origin, run_id, frame) VALUES (1.0, 't', NULL, NULL, ?)", (frame,))
    conn.execute("INSERT INTO runs (run_id, origin, conversation, state, started_at) VALUES ('r', 'o', 'c', 'running', 0)")
    conn.commit()
    conn.close()


def test_versions_are_increasing_from_one() -> None:
    versions = [v for v, _ in MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    assert SCHEMA_VERSION == versions[-1] >= 2


def test_new_file_gets_the_current_version(store: Store) -> None:
    with store.snapshot() as conn:
        assert schema_version(conn) == SCHEMA_VERSION


def test_v1_file_migrates_and_keeps_its_data(db_path: Path) -> None:
    _make_v1(db_path)
    with Store.open(db_path) as s:
        with s.snapshot() as conn:
            assert schema_version(conn) == SCHEMA_VERSION
        assert s.get_grant("o").tools == frozenset({"t"})
        assert [e.data for e in s.events_since(0)] == [{"v": 1}]
        assert s.mark_interrupted() == ["r"]
        # tables of version 2 work
        s.add_trust("o", "", "t", "d")
        s.put_pin("srv", "t", "d", "read")
        s.save_conversation("c", "o", "", [], {})
        assert s.has_trust("o", "", "t", "d") and s.get_pin("srv", "t") and s.load_conversation("c")
        assert s.append_event("t", {}).id == 2


def test_newer_file_is_refused_with_a_clear_error(db_path: Path) -> None:
    Store.open(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaError) as info:
        Store.open(db_path)
    assert "newer relay-jupyter" in info.value.message
    assert info.value.data == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}


def test_failed_step_leaves_the_previous_version(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    steps = [(1, "CREATE TABLE a (x INTEGER);"), (2, "CREATE TABLE b (x INTEGER);\nCREATE TABLE a (y INTEGER);")]
    with pytest.raises(SchemaError, match="version 2"):
        migrate(conn, steps)
    assert schema_version(conn) == 1
    # table b of the failed step was rolled back with it
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'b'").fetchone() is None
    conn.close()


def test_callable_steps(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)

    def step2(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO a VALUES (42)")

    assert migrate(conn, [(1, "CREATE TABLE a (x INTEGER);"), (2, step2)]) == 2
    assert conn.execute("SELECT x FROM a").fetchall() == [(42,)]
    assert migrate(conn, [(1, "CREATE TABLE a (x INTEGER);"), (2, step2)]) == 2  # idempotent
    assert conn.execute("SELECT x FROM a").fetchall() == [(42,)]
    conn.close()


def test_foreign_tables_in_the_same_file_are_left_alone(db_path: Path) -> None:
    """storage/checkpoints.py keeps its own tables in relay.db (CREATE TABLE IF NOT EXISTS)."""
    with Store.open(db_path) as s, s.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS checkpoints_test (id INTEGER PRIMARY KEY, v TEXT)")
        conn.execute("INSERT INTO checkpoints_test (v) VALUES ('kept')")
    other = sqlite3.connect(db_path)  # a second connection, as another module would open
    other.execute("CREATE TABLE IF NOT EXISTS checkpoints_test (id INTEGER PRIMARY KEY, v TEXT)")
    other.close()
    with Store.open(db_path) as s, s.snapshot() as conn:
        assert conn.execute("SELECT v FROM checkpoints_test").fetchall() == [("kept",)]


def test_concurrent_first_opens_migrate_once(db_path: Path) -> None:
    errors: list[Exception] = []
    stores: list[Store] = []

    def opener() -> None:
        try:
            stores.append(Store.open(db_path))
        except Exception as exc:  # noqa: BLE001 - collected and asserted empty below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert len({s.append_event("t", {}).id for s in stores}) == 4
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("checkpoints_first", [True, False])
def test_shares_the_file_with_the_checkpoint_journal(db_path: Path, checkpoints_first: bool) -> None:
    """storage/checkpoints.py opens the same file through its own connection, in either order."""
    from relay_jupyter.storage.checkpoints import CheckpointJournal

    old = os.umask(0o022)
    try:
        if checkpoints_first:
            journal = CheckpointJournal(db_path)
            store = Store.open(db_path)
        else:
            store = Store.open(db_path)
            journal = CheckpointJournal(db_path)
    finally:
        os.umask(old)
    try:
        journal.prepare(origin="o", conversation="c", run_id="r", target="a.txt", pre_image=b"x",
                        pending_sha256="0" * 64)
        store.append_events([("t", {}, None, None)] * 3)
        store.run_started("r", "o", "c", {})
        assert [c.target for c in journal.list()] == ["a.txt"]
        assert store.last_event_id() == 3
        for name in ("relay.db", "relay.db-wal", "relay.db-shm"):
            assert stat.S_IMODE(os.stat(db_path.parent / name).st_mode) == 0o600, name
    finally:
        journal.close()
        store.close()
    with Store.open(db_path) as again:
        assert again.last_event_id() == 3 and again.unfinished_runs() == ["r"]


def test_v4_file_upgrades_to_append_only_conversations_and_shared_checkpoints(db_path: Path) -> None:
    """A file as schema 4 left it (conversations as one JSON array, the checkpoint journal's tables
    made by the journal itself, no auto_vacuum) opens as schema 5 with everything kept."""
    from relay_jupyter.storage.schema import V2_SQL, V3_SQL, V4_SQL

    conn = sqlite3.connect(db_path, isolation_level=None)
    migrate(conn, [(1, V1_SQL), (2, V2_SQL), (3, V3_SQL), (4, V4_SQL)])
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi é"}], "turn": 0},
            {"role": "assistant", "content": [{"type": "text", "text": "yo"}], "turn": 0}]
    conn.execute("INSERT INTO conversations VALUES ('c', 'o', 'name', ?, '{\"model\": \"m\"}', 1.0, 2.0)",
                 (json.dumps(msgs),))
    conn.execute("INSERT INTO conversations VALUES ('empty', 'o', '', '[]', '{}', 1.0, 1.0)")
    conn.executescript("""
        CREATE TABLE relay_checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO relay_checkpoint_meta VALUES ('version', '2');
        CREATE TABLE relay_checkpoints (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
            origin TEXT NOT NULL, conversation TEXT, run_id TEXT NOT NULL, target TEXT NOT NULL,
            pre_exists INTEGER NOT NULL, pre_sha256 TEXT, pre_image BLOB, post_sha256 TEXT, pending_sha256 TEXT,
            state TEXT NOT NULL, note TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, updated_at REAL NOT NULL,
            owner TEXT);
        INSERT INTO relay_checkpoints (id, origin, run_id, target, pre_exists, pre_image, state, created_at,
            updated_at, owner) VALUES ('ckpt_old', 'o', 'r', 't', 1, x'6f6c64', 'applied', 0, 0, 'own_gone');
    """)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    with Store.open(db_path) as s:
        with s.snapshot() as c:
            assert schema_version(c) == SCHEMA_VERSION >= 5  # 6: telemetry (an empty new table)
            assert c.execute("SELECT messages FROM conversations WHERE conv_id = 'c'").fetchone()[0] == "[]"
        assert s.query("PRAGMA auto_vacuum")[0][0] == 2  # switched over by one VACUUM at open
        row = s.load_conversation("c")
        assert row is not None and row["messages"] == msgs and row["meta"] == {"model": "m"}
        assert (row["created_at"], row["updated_at"]) == (1.0, 2.0)
        assert [(c["conv_id"], c["message_count"]) for c in s.list_conversations()] == [("c", 2), ("empty", 0)]
        s.append_messages("c", "o", "name", 2, [{"role": "user", "content": "more", "turn": 1}], {})
        assert len(s.load_conversation("c")["messages"]) == 3  # type: ignore[index]
        # the journal's rows are the store's: same connection, the pre-image kept
        assert s.checkpoints.get("ckpt_old").state == "applied"  # type: ignore[union-attr]
        assert s.checkpoints.pre_image("ckpt_old") == b"old" and s.checkpoints.owner_of("ckpt_old") == "own_gone"
