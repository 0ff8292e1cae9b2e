"""The checkpoint journal: every push's pre-image, staged durably before the file is touched.

It lives in the broker's SQLite file, in tables of the store's schema (since schema 5; its own
version row stays in ``relay_checkpoint_meta``), on the store's one connection: a broker reaches it
as ``store.checkpoints``. ``CheckpointJournal(path)`` opens a file on its own (tools, tests).
Its commits use ``synchronous=FULL``: a checkpoint that says "prepared" has its pre-image on disk.

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
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from ..core.ports import Checkpoint
from ._db import Database
from .errors import SchemaError, StoreError
from .leases import lease_rows, owner_alive

__all__ = ["Checkpoint", "CheckpointJournal", "CheckpointRows", "SCHEMA_VERSION", "STATES"]

SCHEMA_VERSION = 2
STATES = ("prepared", "applied", "reverting", "reverted")

_COLS = ("seq, id, origin, conversation, run_id, target, pre_exists, pre_sha256, post_sha256, "
         "pending_sha256, state, note, created_at, updated_at")


def sha256(data: bytes | None) -> str | None:
    """Hex SHA-256, or None for an absent file."""
    return None if data is None else hashlib.sha256(data).hexdigest()


class CheckpointRows:
    """The ``CheckpointStore`` methods both journals share: this module's (SQLite) and the PostgreSQL
    store's (``storage.postgres.PgCheckpointJournal``). Their statements are spelled by the store's
    dialect (storage/dialect.py); a journal gives its table, its database (``query``, ``sql``,
    ``now``), its write transaction (:meth:`_writing`) and the lease rows (:meth:`_lease_rows`)."""

    _table: str
    _database: Any

    @property
    def owner(self) -> str | None:
        raise NotImplementedError

    def _writing(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _lease_rows(self) -> list[dict[str, Any]] | None:
        raise NotImplementedError

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._database.query(self._database.sql(sql), args)

    # -- reading ---------------------------------------------------------------------------

    def _rows(self, where: str, args: Sequence[Any]) -> list[Checkpoint]:
        rows = self._query(f"SELECT {_COLS} FROM {self._table} {where}", args)
        return [Checkpoint(int(r[0]), r[1], r[2], r[3], r[4], r[5], bool(r[6]), *r[7:]) for r in rows]

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        """One checkpoint by id."""
        rows = self._rows("WHERE id = ?", (checkpoint_id,))
        return rows[0] if rows else None

    def pre_image(self, checkpoint_id: str) -> bytes | None:
        """The staged pre-image (None when the target did not exist before the push)."""
        rows = self._query(f"SELECT pre_image FROM {self._table} WHERE id = ?", (checkpoint_id,))
        return None if not rows or rows[0][0] is None else bytes(rows[0][0])

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
        owners = dict(self._query(f"SELECT id, owner FROM {self._table} WHERE state IN ('prepared', 'reverting')"))
        return [r for r in rows if owners.get(r.id) is None or owners.get(r.id) not in live]

    def owner_of(self, checkpoint_id: str) -> str | None:
        """The lease id of the broker that made ``checkpoint_id`` (None: unknown, or before leases)."""
        rows = self._query(f"SELECT owner FROM {self._table} WHERE id = ?", (checkpoint_id,))
        return rows[0][0] if rows else None

    def live_owners(self) -> set[str] | None:
        """Owner ids alive now, from the store's ``owners`` table (None when the file has none)."""
        rows = self._lease_rows()
        if rows is None:
            return None
        now = self._database.now()
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
        with self._writing() as conn:
            conn.execute(self._database.sql(
                f"INSERT INTO {self._table} (id, origin, conversation, run_id, target, pre_exists, "
                "pre_sha256, pre_image, post_sha256, pending_sha256, state, created_at, updated_at, owner) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, 'prepared', ?, ?, ?)"),
                (cid, origin, conversation, run_id, target, pre_image is not None, sha256(pre_image),
                 pre_image, pending_sha256, now, now, self.owner))
        got = self.get(cid)
        assert got is not None
        return got

    def _update(self, checkpoint_id: str, sets: str, args: tuple[Any, ...]) -> None:
        with self._writing() as conn:
            conn.execute(self._database.sql(f"UPDATE {self._table} SET {sets}, updated_at = ? WHERE id = ?"),
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


class CheckpointJournal(CheckpointRows):
    """Durable checkpoint rows (the ``CheckpointStore`` port) in a store's SQLite file."""

    _table = "relay_checkpoints"

    def __init__(self, db_path: str | Path | None = None, *, owner: str | None = None,
                 database: Database | None = None) -> None:
        """The journal of ``database`` (a store: same connection, lock and transactions; new
        checkpoints carry its lease), or of the file at ``db_path`` on a connection of its own
        (creating it 0600 and migrating it like the store does); ``owner`` then is the lease new
        checkpoints carry.

        Raises:
            StoreError: the file cannot be opened or is not a usable SQLite database.
            SchemaError: the journal was written by a newer relay-jupyter.
        """
        self._owner = owner
        if database is None:
            if db_path is None:
                raise TypeError("CheckpointJournal needs a db_path or a database")
            path = Path(db_path)
            try:
                conn = Database._connect(path)
            except SchemaError:
                raise
            except StoreError as exc:
                raise StoreError(f"{path} is not a usable checkpoint journal ({exc.message}); move it away "
                                 "to start fresh", data={"path": str(path)}) from exc
            database = Database(conn, path, time.time)
            self._own = True
        else:
            self._own = False
        self._database = database
        self.db_path = str(database.path)
        row = database.query("SELECT value FROM relay_checkpoint_meta WHERE key = 'version'")
        if row and (not str(row[0][0]).isdigit() or int(row[0][0]) > SCHEMA_VERSION):
            if self._own:
                database.close()
            raise SchemaError(
                f"the checkpoint journal in {self.db_path} is version {row[0][0]}, newer than this relay "
                f"({SCHEMA_VERSION}); upgrade relay-jupyter", data={"path": self.db_path})

    @property
    def owner(self) -> str | None:
        """The lease new checkpoints carry: the store's own, or the one given."""
        return self._owner if self._owner is not None else self._database.owner_id

    @owner.setter
    def owner(self, value: str | None) -> None:
        self._owner = value

    @property
    def _db(self) -> sqlite3.Connection:
        return self._database._require()

    @property
    def _lock(self) -> Any:
        return self._database._lock

    def close(self) -> None:
        """Close the connection when it is the journal's own (a store's journal closes with the store)."""
        if self._own:
            self._database.close()

    def _lease_rows(self) -> list[dict[str, Any]] | None:
        with self._lock:
            return lease_rows(self._db)

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One store transaction with ``synchronous=FULL`` (the commit is on disk when it returns).
        A failed write (a full disk) is the store's refusal (STORAGE_FULL / STORAGE_ERROR, and
        ``storage_problem`` is set), so a push answers with that code; nothing is half-written."""
        db = self._database
        with db._lock:
            conn = db._require()
            full = not db._depth  # inside an outer transaction the outer one decides how it commits
            if full:
                conn.execute("PRAGMA synchronous = FULL")
            try:
                with db.transaction() as tx:
                    yield tx
            finally:
                if full and db._conn is not None:
                    conn.execute("PRAGMA synchronous = NORMAL")
