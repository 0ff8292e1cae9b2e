"""Store basics: file location and mode, WAL, round trips of grants, ledger, conversations, trust, pins."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from relay_jupyter.core.ports import EventStore, GrantStore, Ledger, RunJournal
from relay_jupyter.core.types import Budget, Grant, ToolClass
from relay_jupyter.storage import Store, StoreError


def test_implements_the_ports(store: Store) -> None:
    for port in (GrantStore, Ledger, EventStore, RunJournal):
        assert isinstance(store, port)


def test_wal_mode_and_synchronous_normal(store: Store, db_path: Path) -> None:
    with store.snapshot() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    # a second connection sees WAL as the file's persistent mode
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


def test_files_are_private(store: Store, db_path: Path) -> None:
    store.append_event("x", {})
    for name in ("relay.db", "relay.db-wal", "relay.db-shm"):
        mode = stat.S_IMODE(os.stat(db_path.parent / name).st_mode)
        assert mode == 0o600, (name, oct(mode))


def test_existing_loose_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    Store.open(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_default_location_follows_jupyter_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jd"))
    with Store.open() as s:
        assert s.path == tmp_path / "jd" / "relay" / "relay.db"
        assert s.path.exists()
        assert stat.S_IMODE(os.stat(s.path.parent).st_mode) == 0o700


def test_not_a_database_gives_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable relay database"):
        Store.open(path)


def test_closed_store_refuses(db_path: Path) -> None:
    s = Store.open(db_path)
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(StoreError, match="closed"):
        s.append_event("x", {})
    with pytest.raises(StoreError, match="closed"):
        s.get_grant("o")


def test_data_survives_reopen(db_path: Path) -> None:
    with Store.open(db_path) as s:
        s.put_grant(Grant(origin="o", tools=frozenset({"a"}), consent_id="c"))
        s.append_event("x", {"k": 1})
    with Store.open(db_path) as s:
        assert s.get_grant("o").tools == frozenset({"a"})
        assert [e.data for e in s.events_since(0)] == [{"k": 1}]


# -- grants and ledger ------------------------------------------------------------------------


def test_grants_round_trip(store: Store) -> None:
    g = Grant(origin="notebook:a.ipynb#k1", tools=frozenset({"scratch__read", "*"}), models=frozenset({"m"}),
              budget=Budget(requests_per_minute=None, tokens_per_day=10), expires_at=5.0, consent_id="c1")
    assert store.get_grant(g.origin) is None
    store.put_grant(g)
    assert store.get_grant(g.origin) == g
    g2 = g.model_copy(update={"tools": frozenset({"x"})})
    store.put_grant(g2)
    assert store.get_grant(g.origin) == g2
    store.put_grant(Grant(origin="a", consent_id="c2"))
    assert [x.origin for x in store.list_grants()] == ["a", g.origin]
    assert store.delete_grant(g.origin) is True
    assert store.delete_grant(g.origin) is False
    assert store.get_grant(g.origin) is None


def test_put_grant_needs_a_grant(store: Store) -> None:
    with pytest.raises(TypeError):
        store.put_grant({"origin": "o"})  # type: ignore[arg-type]


def test_ledger_adds_up(store: Store) -> None:
    assert store.usage("o", "2026-01-01") == (0, 0.0)
    store.add_usage("o", "2026-01-01", 100, 0.5)
    store.add_usage("o", "2026-01-01", 20, 0.25)
    store.add_usage("o", "2026-01-02", 1, 0.0)
    assert store.usage("o", "2026-01-01") == (120, 0.75)
    assert store.usage("o", "2026-01-02") == (1, 0.0)
    assert store.usage("other", "2026-01-01") == (0, 0.0)


@pytest.mark.parametrize("tokens,cost,error", [
    (-1, 0.0, ValueError), (0, -0.01, ValueError), (0, float("nan"), ValueError), (0, float("inf"), ValueError),
    ("5", 0.0, TypeError), (True, 0.0, TypeError), (None, 0.0, TypeError)])
def test_ledger_refuses_bad_amounts(store: Store, tokens: object, cost: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.add_usage("o", "2026-01-01", tokens, cost)  # type: ignore[arg-type]
    assert store.usage("o", "2026-01-01") == (0, 0.0)


def test_ledger_never_loses_concurrent_adds(store: Store) -> None:
    def worker() -> None:
        for _ in range(100):
            store.add_usage("o", "d", 3, 0.5)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.usage("o", "d") == (1800, 300.0)


# -- conversations --------------------------------------------------------------------------


def test_conversations_round_trip(store: Store, clock) -> None:
    msgs = [{"role": "user", "content": "hé"}, {"role": "assistant", "content": [{"type": "text", "text": "x"}]}]
    store.save_conversation("c1", "o1", "first", msgs, {"model": "m"})
    clock.advance(1)
    store.save_conversation("c2", "o2", "", [], {})
    conv = store.load_conversation("c1")
    assert conv is not None
    assert conv["messages"] == msgs and conv["meta"] == {"model": "m"} and conv["name"] == "first"
    created = conv["created_at"]
    clock.advance(1)
    store.save_conversation("c1", "o1", "renamed", msgs + [{"role": "user", "content": "more"}], {})
    conv = store.load_conversation("c1")
    assert conv["created_at"] == created and conv["updated_at"] == created + 2 and conv["name"] == "renamed"
    listing = store.list_conversations()
    assert [c["conv_id"] for c in listing] == ["c1", "c2"]  # most recently updated first
    assert listing[0]["message_count"] == 3 and "messages" not in listing[0]
    assert [c["conv_id"] for c in store.list_conversations("o2")] == ["c2"]
    assert store.delete_conversation("c1") is True
    assert store.delete_conversation("c1") is False
    assert store.load_conversation("c1") is None


@pytest.mark.parametrize("args,error", [
    (("", "o", "n", [], {}), ValueError),
    (("c", None, "n", [], {}), TypeError),
    (("c", "o", None, [], {}), TypeError),
    (("c", "o", "n", "not a list", {}), TypeError),
    (("c", "o", "n", ["not a dict"], {}), TypeError),
    (("c", "o", "n", [], []), TypeError),
    (("c\x00", "o", "n", [], {}), ValueError),
])
def test_save_conversation_refuses_bad_input(store: Store, args: tuple, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.save_conversation(*args)
    assert store.list_conversations() == []


# -- trust and pins -------------------------------------------------------------------------


def test_trust_is_bound_to_the_digest(store: Store) -> None:
    store.add_trust("o1", "srv", "write", "d1")
    store.add_trust("o1", "srv", "other", "d9")
    store.add_trust("o2", "srv", "write", "d1")
    assert store.has_trust("o1", "srv", "write", "d1")
    assert not store.has_trust("o1", "srv", "write", "d2")  # the tool changed: no longer trusted
    assert not store.has_trust("o3", "srv", "write", "d1")  # another notebook
    store.add_trust("o1", "srv", "write", "d2")  # re-approved after the change
    assert store.has_trust("o1", "srv", "write", "d2") and not store.has_trust("o1", "srv", "write", "d1")
    assert [(t["origin"], t["server"], t["tool"]) for t in store.list_trust()] == [
        ("o1", "srv", "other"), ("o1", "srv", "write"), ("o2", "srv", "write")]
    assert [t["tool"] for t in store.list_trust("o2")] == ["write"]
    assert store.revoke_trust("o1", server="srv", tool="write") == 1
    assert store.revoke_trust("o1", server="srv", tool="write") == 0
    assert store.revoke_trust("o1") == 1
    assert store.list_trust("o1") == []
    assert store.has_trust("o2", "srv", "write", "d1")


def test_pins_round_trip(store: Store) -> None:
    assert store.get_pin("srv", "t") is None
    store.put_pin("srv", "t", "d1", ToolClass.READ)
    store.put_pin("srv", "a", "d2", "contained")
    assert store.get_pin("srv", "t") == ("d1", ToolClass.READ)
    store.put_pin("srv", "t", "d3", ToolClass.WRITE)
    assert store.get_pin("srv", "t") == ("d3", ToolClass.WRITE)
    assert [(p["server"], p["tool"], p["tool_class"]) for p in store.list_pins()] == [
        ("srv", "a", ToolClass.CONTAINED), ("srv", "t", ToolClass.WRITE)]
    assert store.delete_pin("srv", "t") is True
    assert store.delete_pin("srv", "t") is False
    assert store.get_pin("srv", "t") is None


def test_pin_refuses_unknown_class(store: Store) -> None:
    with pytest.raises(ValueError):
        store.put_pin("srv", "t", "d", "readonly")
    with pytest.raises(ValueError):
        store.add_trust("o", "", "", "d")
    assert store.list_pins() == []


def test_pin_table_refuses_a_smuggled_class(store: Store) -> None:
    """Even a direct SQL write cannot store a class outside read|contained|write."""
    with pytest.raises(sqlite3.IntegrityError), store.transaction() as conn:
        conn.execute("INSERT INTO pins VALUES ('s', 't', 'd', 'trusted', 0)")
    assert store.list_pins() == []


def test_transaction_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction() as conn:
        conn.execute("INSERT INTO trust VALUES ('o', '', 't', 'd', 0)")
        raise RuntimeError("boom")
    assert store.list_trust() == []
    store.add_trust("o", "", "t", "d")  # the connection is still usable
    assert store.has_trust("o", "", "t", "d")


def test_unopenable_path_gives_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreError, match="cannot open the relay database"):
        Store.open(tmp_path / "adir")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match="cannot open the relay database"):
        Store.open(tmp_path / "afile" / "relay.db")
