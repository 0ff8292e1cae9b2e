"""The one SQLite connection of a :class:`~relay_jupyter.storage.sqlite.Store` and its transactions.

One connection shared by every thread (``check_same_thread=False``) behind one lock. Measured on
this machine (docs/storage.md): a connection per thread only adds ``SQLITE_BUSY`` retries for
writers, since SQLite admits one writer at a time anyway, and the broker's reads are short.
"""

from __future__ import annotations

import json
import json.encoder
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Self

from .errors import StoreError
from .schema import migrate

__all__ = ["Database", "check_amount", "check_text", "dumps"]

BUSY_TIMEOUT_MS = 5000


# One encoder instance: json.dumps with non-default options builds a new encoder per call (2x slower).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
# JSONEncoder.encode spends more time in its Python wrapper (iterencode, option checks) than the C
# encoder spends encoding a small dict (3.6 µs vs 1.6 µs per event here): call the C encoder directly.
# A fresh ``markers`` dict per call keeps the circular-reference check exactly as JSONEncoder does it.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)


def dumps(value: Any) -> str:
    """Compact JSON for a column. Odd values (paths, datetimes) become strings rather than failing a run."""
    if _c_make_encoder is None:  # a Python without the _json accelerator
        return _ENCODER.encode(value)
    return "".join(_c_make_encoder({}, str, encode_basestring, None, ":", ",", False, False, True)(value, 0))


def check_text(name: str, value: Any, *, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a string (or None when ``optional``), ``ValueError`` when
    it is empty or holds a NUL."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL")


def check_amount(name: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is a number, ``ValueError`` unless it is finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def _create_private(path: Path) -> None:
    """Create the file 0600 before SQLite opens it; SQLite gives new -wal and -shm files the same mode.

    Existing files are tightened too: another module's connection may have created them first.

    An existing database file is never opened here: SQLite's locks are POSIX advisory locks, which
    belong to the process and are all dropped when the process closes *any* descriptor of the file.
    Opening and closing ``relay.db`` while another connection of this process (the store, the
    checkpoint journal) has it open would silently release that connection's locks; another
    process's connection then believes it is the last one, checkpoints and deletes the WAL, and this
    process goes on reading a stale snapshot forever (a grant revoked from the terminal stayed live
    in the daemon). ``O_EXCL`` only ever creates a file nobody has open.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


class Database:
    """Connection, lock, clock and transactions; the store's mixins build on this."""

    def __init__(self, conn: sqlite3.Connection, path: Path, clock: Callable[[], float]) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.RLock()
        self._clock = clock
        self.path = path

    @classmethod
    def _connect(cls, path: Path) -> sqlite3.Connection:
        """Open ``path`` in WAL mode and migrate it. Raises StoreError / SchemaError with a clear message."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _create_private(path)
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the relay database {path}: {getattr(exc, 'strerror', None) or exc}",
                             data={"path": str(path)}) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path} cannot use WAL mode (got {mode!r}); put it on a local disk")
            # NORMAL in WAL mode: a commit survives a process crash; only power loss may lose the newest commits
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn, where=str(path))
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{path} is not a usable relay database ({exc}); move it away to start fresh",
                             data={"path": str(path)}) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the relay store is closed")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) holding the store lock.

        Other storage modules (``storage/checkpoints.py``) may use it for their own tables.
        Raises StoreError when the database stays busy for longer than the busy timeout.
        """
        with self._lock:
            conn = self._require()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"the relay database is busy or unwritable: {exc}") from exc
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                conn.execute("ROLLBACK")
                raise StoreError(f"the relay database could not commit: {exc}") from exc

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one consistent state."""
        with self._lock:
            conn = self._require()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """One SELECT in autocommit mode."""
        with self._lock:
            return self._require().execute(sql, params).fetchall()

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        """Close the connection (checkpointing the WAL). Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        return self._conn is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
