"""Ownership in the store (issue 12): leases, who is dead, what recovery may touch, one terminal event,
and what a failed write does (a full database: ``PRAGMA max_page_count`` makes SQLite answer SQLITE_FULL
exactly as a full disk does)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.errors import Refusal
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.storage.errors import StorageUnavailable
from relay_jupyter.storage.leases import host_identity, owner_alive, process_start
from relay_jupyter.storage.sqlite import Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "relay.db"


def dead_pid() -> int:
    """A pid that ran and is gone (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def terminals(store: Store, run_id: str) -> list[str]:
    return [e.type for e in store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS]


def test_a_lease_is_alive_while_its_process_runs_and_dead_after(db: Path) -> None:
    with Store.open(db) as a, Store.open(db) as b:
        owner = a.acquire_lease(ttl=30)
        (row,) = b.leases()
        assert row["owner_id"] == owner and row["pid"] == os.getpid() and row["host"] == host_identity()
        assert row["proc_start"] == process_start(os.getpid())
        assert owner in b.live_owners()
        # same host, pid gone: dead at once (no waiting for the lease to expire)
        a.query("SELECT 1")
        with a.transaction() as conn:
            conn.execute("UPDATE owners SET pid = ? WHERE owner_id = ?", (dead_pid(), owner))
        assert owner not in b.live_owners()
        # pid alive but started at another time: a reused pid, the owner is dead
        with a.transaction() as conn:
            conn.execute("UPDATE owners SET pid = ?, proc_start = '1' WHERE owner_id = ?", (os.getpid(), owner))
        assert owner not in b.live_owners()
        assert owner in a.live_owners()  # a store always counts itself alive
        a.release_lease()
        assert b.leases() == []


def test_another_hosts_lease_lives_until_it_expires() -> None:
    row = {"owner_id": "x", "host": "elsewhere|boot|pid:[1]", "pid": 1, "proc_start": "5",
           "renewed_at": 1000.0, "ttl": 30.0}
    assert owner_alive(row, 1029.0)
    assert not owner_alive(row, 1031.0)


def test_recovery_sees_only_dead_owners_runs_and_never_ends_a_run_twice(db: Path) -> None:
    with Store.open(db) as live, Store.open(db) as dead, Store.open(db) as other:
        live.acquire_lease()
        dead_owner = dead.acquire_lease()
        live.run_started("run_live", "o", "c1", {})
        dead.run_started("run_dead", "o", "c2", {})
        with dead.transaction() as conn:  # the dead broker's process is gone
            conn.execute("UPDATE owners SET pid = ? WHERE owner_id = ?", (dead_pid(), dead_owner))
        other.acquire_lease()
        assert [r["run_id"] for r in other.runs_to_recover()] == ["run_dead"]
        assert other.running_elsewhere("c1") and not other.running_elsewhere("c2")
        first = other.finish_run("run_dead", "interrupted", None,
                                 [(EventType.INTERRUPTED, {"run_id": "run_dead"}, "o", "run_dead")])
        assert first is not None and [e.type for e in first[0]] == [EventType.INTERRUPTED]
        # the "dead" broker was only frozen and now finishes its run: nothing is written
        assert dead.finish_run("run_dead", "done", None, [(EventType.DONE, {"run_id": "run_dead"}, "o",
                                                           "run_dead")]) is None
        assert terminals(other, "run_dead") == [EventType.INTERRUPTED]
        assert dead.terminal_event("run_dead").type == EventType.INTERRUPTED
        assert other.get_run("run_dead")["state"] == "interrupted"
        assert other.runs_to_recover() == []


def test_pending_permissions_follow_their_events_in_the_same_transaction(db: Path) -> None:
    with Store.open(db) as store:
        owner = store.acquire_lease()
        store.append_events([(EventType.PERMISSION_REQUEST, {"request_id": "pr_1"}, "o", "r1"),
                             (EventType.PERMISSION_REQUEST, {"request_id": "pr_2"}, "o", "r1"),
                             (EventType.PERMISSION_REQUEST, {"request_id": "pr_3"}, "o", None)])
        assert [(p["request_id"], p["owner"]) for p in store.pending_permissions()] == \
            [("pr_1", owner), ("pr_2", owner), ("pr_3", owner)]
        store.append_event(EventType.PERMISSION_RESOLVED, {"request_id": "pr_1"}, origin="o", run_id="r1")
        store.append_event(EventType.PERMISSION_TIMEOUT, {"request_id": "pr_3"}, origin="o")
        assert [p["request_id"] for p in store.pending_permissions(run_id="r1")] == ["pr_2"]
        assert store.pending_permissions(live={owner}) == []  # its owner lives: not recovery's
        assert [p["request_id"] for p in store.pending_permissions(live=set())] == ["pr_2"]


def test_a_full_database_raises_storage_full_not_cannot_rollback(db: Path) -> None:
    with Store.open(db) as store:
        store.acquire_lease()
        store.append_event("t", {})
        pages = store.query("PRAGMA page_count")[0][0]
        store.query(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageUnavailable) as info:
            store.append_events([("t", {"blob": "x" * 5000}, None, None)] * 20)
        # the real error, as a Refusal with the code clients match on and one sentence to act on
        assert isinstance(info.value, Refusal) and info.value.code.value == "STORAGE_FULL"
        assert "free some space" in info.value.message and "rollback" not in info.value.message
        assert store.storage_problem is info.value
        assert not store._conn.in_transaction
        # nested (savepoint) transactions roll back with the outer one, same error
        with pytest.raises(StorageUnavailable), store.transaction():
            store.run_started("r", "o", "c", {})
            store.append_events([("t", {"blob": "x" * 5000}, None, None)] * 20)
        assert store.get_run("r") is None
        store.query("PRAGMA max_page_count = 1073741823")
        store.probe_write()  # space again: the next write clears the problem
        assert store.storage_problem is None
        assert store.append_event("t", {}).id == 2


def test_a_savepoint_rolls_back_alone_and_the_outer_transaction_commits(db: Path) -> None:
    with Store.open(db) as store:
        with store.transaction():
            store.run_started("r1", "o", "c", {})
            with pytest.raises(KeyError):
                store.finish_run("nope", "done", None, [])
            store.append_event("t", {}, run_id="r1")
        assert store.get_run("r1") is not None and len(store.events_since(0)) == 1


def test_checkpoints_of_a_live_broker_are_not_unfinished_for_others(db: Path) -> None:
    with Store.open(db) as a_store, Store.open(db) as b_store:
        a = a_store.acquire_lease()
        b = b_store.acquire_lease()
        ja, jb = CheckpointJournal(db, owner=a), CheckpointJournal(db, owner=b)
        try:
            mine = ja.prepare(origin="o", conversation=None, run_id="r", target="x.txt", pre_image=b"1",
                              pending_sha256="0" * 64)
            assert ja.owner_of(mine.id) == a
            # a live broker's push in flight is nobody's to settle: not its own (it is making it), not b's
            assert ja.unfinished() == [] and jb.unfinished() == []
            assert [c.id for c in jb.unfinished(all_owners=True)] == [mine.id]
            with a_store.transaction() as conn:
                conn.execute("UPDATE owners SET pid = ? WHERE owner_id = ?", (dead_pid(), a))
            assert [c.id for c in jb.unfinished()] == [mine.id]  # its owner died: now it is b's to settle
        finally:
            ja.close()
            jb.close()


def test_a_checkpoint_journal_of_version_1_gains_the_owner_column(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.executescript("""
        CREATE TABLE relay_checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO relay_checkpoint_meta VALUES ('version', '1');
        CREATE TABLE relay_checkpoints (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
            origin TEXT NOT NULL, conversation TEXT, run_id TEXT NOT NULL, target TEXT NOT NULL,
            pre_exists INTEGER NOT NULL, pre_sha256 TEXT, pre_image BLOB, post_sha256 TEXT, pending_sha256 TEXT,
            state TEXT NOT NULL, note TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, updated_at REAL NOT NULL);
        INSERT INTO relay_checkpoints (id, origin, run_id, target, pre_exists, state, created_at, updated_at)
            VALUES ('ckpt_old', 'o', 'r', 't', 0, 'prepared', 0, 0);
    """)
    conn.close()
    journal = CheckpointJournal(db, owner="own_x")
    try:
        assert journal.owner_of("ckpt_old") is None
        assert [c.id for c in journal.unfinished()] == ["ckpt_old"]  # no owner: from before leases, dead
        assert journal._db.execute("SELECT value FROM relay_checkpoint_meta").fetchone()[0] == "2"
    finally:
        journal.close()


def test_a_full_database_refuses_a_checkpoint_with_storage_full(db: Path) -> None:
    journal = CheckpointJournal(db, owner="own_x")
    try:
        first = journal.prepare(origin="o", conversation=None, run_id="r", target="a.txt", pre_image=b"x",
                                pending_sha256="0" * 64)
        pages = journal._db.execute("PRAGMA page_count").fetchone()[0]
        journal._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageUnavailable) as info:
            journal.prepare(origin="o", conversation=None, run_id="r2", target="b.txt", pre_image=b"y" * 50_000,
                            pending_sha256="1" * 64)
        assert info.value.code.value == "STORAGE_FULL"
        assert [c.id for c in journal.list()] == [first.id]  # nothing half-written
    finally:
        journal.close()
