"""storage.checkpoints: its own SQLite connection keeps the files private and fails with RelayErrors."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from relay_jupyter.core.errors import RelayError
from relay_jupyter.storage.checkpoints import SCHEMA_VERSION, CheckpointJournal
from relay_jupyter.storage.errors import SchemaError, StoreError


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_journal_files_are_0600_even_under_a_loose_umask(tmp_path: Path) -> None:
    db = tmp_path / "data" / "relay.db"
    old = os.umask(0o022)
    try:
        j = CheckpointJournal(db)
        j.prepare(origin="k", conversation=None, run_id="r", target="a.txt", pre_image=b"secret body",
                  pending_sha256="0" * 64)
        files = [p for p in db.parent.iterdir() if p.name.startswith("relay.db")]
        assert db in files and len(files) >= 2  # the main file and its -wal at least
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
        j.close()
    finally:
        os.umask(old)


def test_existing_loose_file_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    CheckpointJournal(db).close()
    assert _mode(db) == 0o600


def test_schema_too_new_is_a_schema_error_not_a_runtime_error(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    CheckpointJournal(db).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE relay_checkpoint_meta SET value = ? WHERE key = 'version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError) as exc:
        CheckpointJournal(db)
    assert isinstance(exc.value, RelayError) and "newer than this relay" in exc.value.message


def test_not_a_database_and_unopenable_path_are_store_errors(tmp_path: Path) -> None:
    junk = tmp_path / "relay.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError) as exc:
        CheckpointJournal(junk)
    assert "not a usable checkpoint journal" in exc.value.message
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        CheckpointJournal(blocker / "sub" / "relay.db")  # parent is a regular file
