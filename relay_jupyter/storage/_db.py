"""The one SQLite connection of a :class:`~relay_jupyter.storage.sqlite.Store` and its transactions.

One connection shared by every thread (``check_same_thread=False``) behind one lock. Measured on
this machine (docs/storage.md): a connection per thread only adds ``SQLITE_BUSY`` retries for
writers, since SQLite admits one writer at a time anyway, and the broker's reads are short.

Reads made outside the reading thread's own transaction go to a second connection of their own
(WAL: a reader never waits for a writer): a write waiting for another process's write lock (up to
the busy timeout, on a store thread: runtime/offload.py) holds the store lock, and a read on the
event loop (``readyz``'s last event id, an SSE replay, a grant) must not wait behind it.
"""

from __future__ import annotations

import errno
import json
import json.encoder
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Self

from ..core.memory import check_amount, check_text
from .dialect import SQLITE, SqlStore
from .errors import StorageUnavailable, StoreError, storage_failure
from .schema import migrate

__all__ = ["Database", "StoreLock", "check_amount", "check_text", "dumps"]

BUSY_TIMEOUT_MS = 5000
MIN_FREE_BYTES = 1 << 20
"""Below this much free space in the data directory the store reports STORAGE_FULL (readyz 503)."""


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


def _enable_incremental_vacuum(conn: sqlite3.Connection) -> None:
    """A file made before schema 5 has no auto_vacuum: switching it on needs one VACUUM (a rewrite of
    the file, once). Tried with a short busy timeout: when another connection (a second broker) is
    using the file it is left for a later start, and pruning then frees pages without shrinking it."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 0:
        return
    conn.execute("PRAGMA busy_timeout = 100")
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
    except sqlite3.OperationalError:
        pass
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


class StoreLock:
    """The store's re-entrant lock, which also knows whether the calling thread holds it.

    ``threading.RLock`` has no public "held by this thread" (its ``_is_owned`` is private), so a
    per-thread count of this lock's acquisitions answers it: :meth:`held` is what routes a read
    inside the thread's own locked section (a transaction, the checkpoint journal's reads) to the
    writer connection, where it sees the uncommitted writes.
    """

    __slots__ = ("_lock", "_local")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._local = threading.local()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._local.depth = getattr(self._local, "depth", 0) + 1
        return True

    def release(self) -> None:
        self._lock.release()  # raises RuntimeError (count untouched) when this thread does not hold it
        self._local.depth -= 1

    def held(self) -> bool:
        """True when the calling thread holds the lock."""
        return getattr(self._local, "depth", 0) > 0

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class Database(SqlStore):
    """Connection, lock, clock and transactions; the store's mixins build on this."""

    sql = SQLITE

    def __init__(self, conn: sqlite3.Connection, path: Path, clock: Callable[[], float]) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = StoreLock()
        self._clock = clock
        self._depth = 0
        """Nesting of :meth:`transaction` on the thread holding the lock (0: none open)."""
        self.path = path
        self.storage_problem: StorageUnavailable | None = None
        """The last write failure, until a write commits again (docs/storage.md: a full disk)."""
        self.owner_id: str | None = None
        """This store's lease (storage/leases.py; None until acquired)."""
        self._reader: sqlite3.Connection | None = None
        """The read connection (module docstring). A second SQLite connection of this process is safe for the
        writer's POSIX locks: SQLite keeps a closed descriptor open while the file is locked (checked: another
        process still cannot take the write lock after a reader of this process closed)."""
        self._read_lock = threading.Lock()
        self._read_connection()  # opened now: the store's descriptors stay the same while it is used

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
            if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                # a new file: pages freed by pruning go back to the file system (prune_events runs
                # incremental_vacuum); must be set before the first table exists
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path} cannot use WAL mode (got {mode!r}); put it on a local disk")
            # NORMAL in WAL mode: a commit survives a process crash; only power loss may lose the newest commits
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn, where=str(path))
            _enable_incremental_vacuum(conn)
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

        Other storage modules (``storage/checkpoints.py``) may use it for their own tables. Nested in
        another transaction of this store (same thread) it is a SAVEPOINT: the outer one commits
        everything together, which is how recovery commits a run's marker and its terminal event as
        one (runtime/recovery.py).

        Raises:
            StorageUnavailable: the write failed (disk full: ``STORAGE_FULL``; I/O error, read-only,
                busy beyond the busy timeout: ``STORAGE_ERROR``). :attr:`storage_problem` is set
                until a later write commits.
        """
        with self._lock:
            conn = self._require()
            if self._depth:
                yield from self._savepoint(conn)
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._failed(exc) from exc
            self._depth = 1
            try:
                yield conn
            except BaseException as exc:
                self._depth = 0
                self._rollback(conn)
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._failed(exc) from exc
                raise
            self._depth = 0
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise self._failed(exc) from exc
            if self.storage_problem is not None:
                self.storage_problem = self._low_space()

    def _savepoint(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        name = f"relay_sp{self._depth}"
        conn.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield conn
        except BaseException:
            self._depth -= 1
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute(f"ROLLBACK TO {name}")
                    conn.execute(f"RELEASE {name}")
            raise
        self._depth -= 1
        conn.execute(f"RELEASE {name}")

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        """Roll back what is still open. SQLite has already rolled back by itself after some errors
        (SQLITE_FULL, SQLITE_IOERR): a second ROLLBACK would raise "cannot rollback - no transaction
        is active" and hide the real error."""
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _failed(self, exc: sqlite3.Error) -> StorageUnavailable:
        """The refusal for a failed write; remembers it (readyz, refusing new runs) unless it was only
        another writer holding the lock."""
        error = storage_failure(exc, str(self.path))
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        if code not in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED: someone else's transaction, not our disk
            self.storage_problem = error
        return error

    def _low_space(self) -> StorageUnavailable | None:
        """STORAGE_FULL while the data directory's file system has less than :data:`MIN_FREE_BYTES`
        free: a write that fit into space SQLite had already allocated does not mean the disk has
        room again (the next one may not fit)."""
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return None
        if st.f_bavail * st.f_frsize >= MIN_FREE_BYTES:
            return None
        return storage_failure(OSError(errno.ENOSPC, "No space left on device"), str(self.path))

    def check_space(self) -> None:
        """Set (or clear, once a write succeeds) :attr:`storage_problem` by the free space alone."""
        low = self._low_space()
        if low is not None:
            self.storage_problem = low

    def _read_connection(self) -> sqlite3.Connection | None:
        """The read connection for a read of this thread, or None when the read belongs on the writer
        connection: inside this thread's own transaction (it sees its uncommitted writes), or a
        database that is not a file."""
        if self._lock.held() or self._conn is None:
            return None
        if self._reader is None:
            if not self.path.is_file():
                return None
            with self._read_lock:  # not the store lock: a writer waiting for the busy timeout holds that
                if self._reader is None and self._conn is not None:
                    reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                             timeout=BUSY_TIMEOUT_MS / 1000)
                    reader.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                    reader.execute("PRAGMA query_only = 1")  # reads only: a write here is a bug, refused
                    reader.execute("PRAGMA synchronous = NORMAL")
                    self._reader = reader
        return self._reader

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one consistent state (inside a write transaction of
        this store, that transaction's state)."""
        reader = self._read_connection()
        if reader is not None:
            with self._read_lock:
                if self._conn is None:
                    raise StoreError("the relay store is closed")
                reader.execute("BEGIN")
                try:
                    yield reader
                finally:
                    if reader.in_transaction:
                        reader.execute("COMMIT")
            return
        with self._lock:
            conn = self._require()
            if self._depth:
                yield conn
                return
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """One SELECT in autocommit mode (anything else, a PRAGMA, on the writer connection, whose
        settings it may change)."""
        reader = self._read_connection() if sql.lstrip()[:6].upper() in ("SELECT", "WITH ") else None
        if reader is not None:
            with self._read_lock:
                if self._conn is None:
                    raise StoreError("the relay store is closed")
                return reader.execute(sql, params).fetchall()
        with self._lock:
            return self._require().execute(sql, params).fetchall()

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        """Close the connection (checkpointing the WAL). Idempotent."""
        with self._lock:
            with self._read_lock:
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
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
