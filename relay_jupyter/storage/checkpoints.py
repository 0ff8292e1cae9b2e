"""The checkpoint journal: every push's pre-image, staged durably before the file is touched.

It lives in the broker's SQLite file, in tables of its own (``CREATE TABLE IF NOT EXISTS``, own
version row in ``relay_checkpoint_meta``), through a connection of its own, so it needs nothing
from the store's migrations. Commits use ``synchronous=FULL``: a checkpoint that says "prepared"
has its pre-image on disk.

One checkpoint per (run, target): the run's first push to a target stages the pre-image; later
pushes of the same run to it only move the expected post-image. States (write-ahead)::

    prepared ──(file written)──▶ applied ──▶ reverting ──(pre-image restored)──▶ reverted

``prepared`` keeps both the last committed post-image digest and the pending one, so a crash
around the write is reconciled against the live file instead of guessed (see
``workspace.checkpointing.reconcile``).

Each checkpoint carries its ``owner``: the lease of the broker that made it (storage/leases.py).
:meth:`CheckpointJournal.unfinished` lists only those of dead owners, so a second broker on the same
data directory never settles a push the first one is still making (version 2 of this journal).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ._db import _create_private
from .errors import SchemaError, StoreError, storage_failure
from .leases import lease_rows, owner_alive

__all__ = ["Checkpoint", "CheckpointJournal", "SCHEMA_VERSION", "STATES"]

SCHEMA_VERSION = 2
STATES = ("prepared", "applied", "reverting", "reverted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS relay_checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS relay_checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    origin TEXT NOT NULL,
    conversation TEXT,
    run_id TEXT NOT NULL,
    target TEXT NOT NULL,
    pre_exists INTEGER NOT NULL,
    pre_sha256 TEXT,
    pre_image BLOB,
    post_sha256 TEXT,
    pending_sha256 TEXT,
    state TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS relay_checkpoints_run ON relay_checkpoints (run_id, target);
CREATE INDEX IF NOT EXISTS relay_checkpoints_origin ON relay_checkpoints (origin, seq);
"""

_COLS = ("seq, id, origin, conversation, run_id, target, pre_exists, pre_sha256, post_sha256, "
         "pending_sha256, state, note, created_at, updated_at")


@dataclass(frozen=True)
class Checkpoint:
    """One journal entry (without its pre-image bytes)."""

    seq: int
    id: str
    origin: str
    conversation: str | None
    run_id: str
    target: str
    """Path relative to the Jupyter root."""
    pre_exists: bool
    pre_sha256: str | None
    post_sha256: str | None
    pending_sha256: str | None
    state: str
    note: str
    created_at: float
    updated_at: float

    def public(self) -> dict:
        """The receipt clients may see (no bytes, no internals beyond digests)."""
        return {
            "id": self.id, "target": self.target, "state": self.state, "run_id": self.run_id,
            "conversation": self.conversation, "created_at": self.created_at, "updated_at": self.updated_at,
            "pre_exists": self.pre_exists, "pre_sha256": self.pre_sha256, "post_sha256": self.post_sha256,
            "note": self.note,
        }


def sha256(data: bytes | None) -> str | None:
    """Hex SHA-256, or None for an absent file."""
    return None if data is None else hashlib.sha256(data).hexdigest()


class CheckpointJournal:
    """Durable checkpoint rows in the SQLite file at ``db_path``."""

    def __init__(self, db_path: str | Path, *, owner: str | None = None) -> None:
        """Open (creating 0600, like the store's own connection) the journal in ``db_path``.

        ``owner`` is the broker's lease (``Store.owner_id``): new checkpoints carry it.

        Raises:
            StoreError: the file cannot be opened or is not a usable SQLite database.
            SchemaError: the journal was written by a newer relay-jupyter.
        """
        self.db_path = str(db_path)
        self.owner = owner
        path = Path(self.db_path)
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Pre-images are file contents: the database and its -wal/-shm must be private to the user.
            _create_private(path)
            self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None, timeout=30)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the checkpoint journal {path}: "
                             f"{getattr(exc, 'strerror', None) or exc}", data={"path": str(path)}) from exc
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            with self._lock:
                self._db.executescript(_SCHEMA)
                row = self._db.execute("SELECT value FROM relay_checkpoint_meta WHERE key='version'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO relay_checkpoint_meta (key, value) VALUES ('version', ?)",
                                     (str(SCHEMA_VERSION),))
                elif not str(row[0]).isdigit() or int(row[0]) > SCHEMA_VERSION:
                    raise SchemaError(
                        f"the checkpoint journal in {self.db_path} is version {row[0]}, newer than this relay "
                        f"({SCHEMA_VERSION}); upgrade relay-jupyter", data={"path": self.db_path})
                self._migrate()
            # WAL mode creates -wal/-shm on first use: tighten them too (SQLite copies the main file's
            # mode, but a file made earlier by another process may be looser).
            _create_private(path)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"{path} is not a usable checkpoint journal ({exc}); move it away to start fresh",
                             data={"path": str(path)}) from exc
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        """Version 2 adds ``owner`` (one transaction; another process may be migrating too)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(relay_checkpoints)")}
            if "owner" not in cols:
                self._db.execute("ALTER TABLE relay_checkpoints ADD COLUMN owner TEXT")
            self._db.execute("UPDATE relay_checkpoint_meta SET value = ? WHERE key = 'version' AND "
                             "CAST(value AS INTEGER) < ?", (str(SCHEMA_VERSION), SCHEMA_VERSION))
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    # -- reading ---------------------------------------------------------------------------

    def _rows(self, where: str, args: tuple) -> list[Checkpoint]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM relay_checkpoints {where}", args).fetchall()
        return [Checkpoint(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), *r[7:]) for r in rows]

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        """One checkpoint by id."""
        rows = self._rows("WHERE id = ?", (checkpoint_id,))
        return rows[0] if rows else None

    def pre_image(self, checkpoint_id: str) -> bytes | None:
        """The staged pre-image (None when the target did not exist before the push)."""
        with self._lock:
            row = self._db.execute("SELECT pre_image FROM relay_checkpoints WHERE id = ?", (checkpoint_id,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def list(self, *, origin: str | None = None, limit: int = 100) -> list[Checkpoint]:
        """Newest first; only ``origin``'s when given."""
        if origin is None:
            return self._rows("ORDER BY seq DESC LIMIT ?", (limit,))
        return self._rows("WHERE origin = ? ORDER BY seq DESC LIMIT ?", (origin, limit))

    def active(self, run_id: str, target: str) -> Checkpoint | None:
        """The run's live checkpoint for ``target`` (prepared or applied), if any."""
        rows = self._rows("WHERE run_id = ? AND target = ? AND state IN ('prepared', 'applied') "
                          "ORDER BY seq DESC LIMIT 1", (run_id, target))
        return rows[0] if rows else None

    def cascade(self, checkpoint_id: str) -> list[Checkpoint]:
        """The selected checkpoint and every later one of its origin not yet reverted, newest first."""
        sel = self.get(checkpoint_id)
        if sel is None:
            return []
        return self._rows("WHERE origin = ? AND seq >= ? AND state != 'reverted' ORDER BY seq DESC",
                          (sel.origin, sel.seq))

    def unfinished(self, *, all_owners: bool = False) -> list[Checkpoint]:
        """Entries a crash may have left between steps (prepared or reverting), oldest first: only
        those of dead owners (a live broker may be in the middle of them), unless ``all_owners``."""
        rows = self._rows("WHERE state IN ('prepared', 'reverting') ORDER BY seq", ())
        if all_owners or not rows:
            return rows
        live = self.live_owners()
        if live is None:
            return rows
        with self._lock:
            owners = dict(self._db.execute("SELECT id, owner FROM relay_checkpoints WHERE "
                                           "state IN ('prepared', 'reverting')").fetchall())
        return [r for r in rows if owners.get(r.id) is None or owners.get(r.id) not in live]

    def owner_of(self, checkpoint_id: str) -> str | None:
        """The lease id of the broker that made ``checkpoint_id`` (None: unknown, or before leases)."""
        with self._lock:
            row = self._db.execute("SELECT owner FROM relay_checkpoints WHERE id = ?", (checkpoint_id,)).fetchone()
        return None if row is None else row[0]

    def live_owners(self) -> set[str] | None:
        """Owner ids alive now, from the store's ``owners`` table (None when the file has none)."""
        with self._lock:
            rows = lease_rows(self._db)
        if rows is None:
            return None
        now = time.time()
        live = {r["owner_id"] for r in rows if owner_alive(r, now, me=self.owner)}
        if self.owner is not None:
            live.add(self.owner)
        return live

    # -- writing ---------------------------------------------------------------------------

    def prepare(self, *, origin: str, conversation: str | None, run_id: str, target: str,
                pre_image: bytes | None, pending_sha256: str) -> Checkpoint:
        """Stage a new checkpoint (pre-image and digest) durably, in state ``prepared``."""
        now = time.time()
        cid = "ckpt_" + secrets.token_hex(8)
        with self._lock, self._writing():
            self._db.execute(
                "INSERT INTO relay_checkpoints (id, origin, conversation, run_id, target, pre_exists, "
                "pre_sha256, pre_image, post_sha256, pending_sha256, state, created_at, updated_at, owner) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, 'prepared', ?, ?, ?)",
                (cid, origin, conversation, run_id, target, int(pre_image is not None), sha256(pre_image),
                 pre_image, pending_sha256, now, now, self.owner))
        got = self.get(cid)
        assert got is not None
        return got

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A failed write (a full disk) is the store's refusal (STORAGE_FULL / STORAGE_ERROR), so a
        push answers with that code instead of an internal error; nothing is half-written (autocommit)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise storage_failure(exc, self.db_path) from exc

    def _update(self, checkpoint_id: str, sets: str, args: tuple) -> None:
        with self._lock, self._writing():
            self._db.execute(f"UPDATE relay_checkpoints SET {sets}, updated_at = ? WHERE id = ?",
                             (*args, time.time(), checkpoint_id))

    def prepare_again(self, checkpoint_id: str, pending_sha256: str) -> None:
        """A later push of the same run to the same target: expect a new post-image."""
        self._update(checkpoint_id, "state = 'prepared', pending_sha256 = ?", (pending_sha256,))

    def mark_applied(self, checkpoint_id: str, post_sha256: str | None, note: str = "") -> None:
        """The push landed: ``post_sha256`` is what the live file must equal for a revert."""
        self._update(checkpoint_id, "state = 'applied', post_sha256 = ?, pending_sha256 = NULL, note = ?",
                     (post_sha256, note))

    def mark_reverting(self, checkpoint_id: str) -> None:
        """About to restore the pre-image."""
        self._update(checkpoint_id, "state = 'reverting'", ())

    def mark_reverted(self, checkpoint_id: str, note: str = "") -> None:
        """The pre-image is back (or the push never landed); the body is no longer needed."""
        self._update(checkpoint_id, "state = 'reverted', pre_image = NULL, pending_sha256 = NULL, note = ?",
                     (note,))
