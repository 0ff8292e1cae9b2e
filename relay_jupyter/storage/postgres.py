"""The PostgreSQL store: everything :class:`~relay_jupyter.storage.sqlite.Store` keeps, in a database
several brokers (several users' servers, several machines) share. See docs/multi-user.md.

    store = PostgresStore.open("postgresql://relay@db.internal:5432/relay",
                               password_file="~/.relay/pg.password")      # 0600
    store.acquire_lease()
    ...
    store.close()

Selected by ``c.RelayApp.store_url = "postgresql://user@host:port/db"``. The password is never
part of the URL: a URL with one is refused (URLs end up in logs and ``ps``). It comes from
``store_password_file`` (a 0600 file holding only the password), the secrets file's
``"store_password"`` entry, or libpq's own sources (``~/.pgpass``, ``PGPASSFILE``).

**Same behaviour as the SQLite store**, method for method (the store contract suite runs over both),
with PostgreSQL's concurrency instead of SQLite's one writer:

- a transaction (:meth:`PgDatabase.transaction`) is one pooled connection's ``BEGIN … COMMIT``; the
  store's methods called inside it (same thread) join it, nested ones as SAVEPOINTs, exactly as
  the SQLite store's nested transactions do (runtime/recovery.py and the run manager rely on it);
- budget holds lock the ledger row they check (``INSERT … ON CONFLICT DO UPDATE … RETURNING``
  takes the row lock, held to commit), so the check and the insert are atomic across every
  broker: ``hold`` never overspends (tests/pg/test_pg_concurrency.py: 50 reservations from
  several processes). Expired holds are charged in a transaction of their own first, their ledger
  rows locked in a fixed order, so two brokers never deadlock on them;
- event ids come from a one-row counter updated inside the append's transaction: appends are
  ordered by its row lock, so ids are committed in order and replay by id never skips one.

The psycopg API used is the synchronous one with a ``psycopg_pool.ConnectionPool`` (thread-safe):
the ``Store`` protocol is synchronous, and the broker runs its store calls on worker threads
(runtime/offload.py), each thread on a pooled connection of its own while it uses one; a thread's
transaction is bound to it (``threading.local``), so calls of other threads never join it. Why sync
in threads rather than async psycopg: docs/storage.md, "Sync psycopg in worker threads, not async".

The statements both stores run are written once (storage/dialect.py and the mixins this class
inherits; the events' in storage/events.py ``EventRows``); what is here is PostgreSQL's own: ``hold``,
the team schema, messages by ``COPY``, event ids from their counter and rows by ``COPY``, the audit
copy, the checkpoint table.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Self

from ..core.memory import append_start, hold_owner, new_hold_id
from ..core.teams import TEAM_PREFIX
from ..core.types import AuditRecord
from ._db import check_amount, check_text, dumps
from .checkpoints import STATES, CheckpointRows
from .errors import StorageUnavailable, StoreError
from .events import EventRows
from .dialect import POSTGRES, SqlStore, where
from .journal import JournalMixin
from .leases import DEFAULT_LEASE_TTL, LEASE_COLUMNS, LeasesMixin, owner_alive
from .records import ConversationsMixin, GrantsMixin, TrustMixin, charge_dead, sweep_expired
from .team_limits import TeamLimitsMixin
from .telemetry import TelemetryMixin
from .pg_schema import MIGRATION_LOCK, migrate

__all__ = ["SHARED_SCHEMA", "PgAuditMirror", "PgCheckpointJournal", "PostgresStore", "is_postgres_url", "read_password",
           "schema_for"]

log = logging.getLogger("relay_jupyter.storage")

POOL_MIN = 1
POOL_MAX = 20
"""More connections than the broker's store threads (runtime/offload.STORE_THREADS, 16): the calls left
on the event loop (event appends) and the maintenance step find a connection while every store thread
holds one (each holds at most one: a thread's nested calls join its transaction). The pool opens
connections only when needed and closes idle ones (``max_idle``, 10 min): the database's
``max_connections`` must cover the brokers' peaks (docs/storage.md)."""
POOL_TIMEOUT = 3.0
"""Seconds to wait for a pooled connection before the store reports STORAGE_ERROR: short, since the
broker calls the store from its event loop too (a database that is down stalls a call this long
once; the broker then refuses new runs until its storage probe succeeds again)."""
CONNECT_TIMEOUT = 5
PRUNE_PAGE = 5000
"""Events deleted per transaction by the PostgreSQL store's ``prune_events`` (storage/events.py)."""
STATEMENT_TIMEOUT_MS = 15000
"""No statement may hold a broker thread longer than this (a lock wait included)."""

_MAX_PASSWORD_FILE = 4096


_SCHEMA_NAME = re.compile(r"^relay_u_[a-z0-9_]{1,60}$")

SHARED_SCHEMA = "relay_shared"
"""The schema of what namespaced stores share: team ledger rows and holds, the audit copy."""


def schema_for(namespace: str) -> str:
    """``relay_u_<namespace>``: lower-case letters, digits and ``_`` (other characters, or a name that
    would be cut, add a hash of the whole name so two users never share a schema)."""
    import hashlib

    if not isinstance(namespace, str) or not namespace:
        raise ValueError("a store namespace must be a non-empty string")
    plain = re.sub(r"[^a-z0-9_]", "_", namespace.lower())[:40]
    if plain != namespace:
        plain = f"{plain}_{hashlib.sha256(namespace.encode()).hexdigest()[:10]}"
    return f"relay_u_{plain}"


def is_postgres_url(url: str | None) -> bool:
    """True for ``postgresql://…`` / ``postgres://…`` URLs."""
    return bool(url) and str(url).split("://", 1)[0].lower() in ("postgresql", "postgres")


def _private_bytes(path: Path, what: str) -> bytes:
    """The contents of a 0600 file of this user (the broker's own check for secrets files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise StoreError(f"the {what} {path} does not exist") from None
    except OSError as exc:
        raise StoreError(f"cannot open the {what} {path} ({exc.strerror}); it must be a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"the {what} {path} is not a regular file")
        if st.st_mode & 0o077:
            raise StoreError(f"the {what} {path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                             f"run: chmod 600 {path}")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise StoreError(f"the {what} {path} is owned by another user")
        raw = os.read(fd, _MAX_PASSWORD_FILE + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_PASSWORD_FILE:
        raise StoreError(f"the {what} {path} is too large")
    return raw


def read_password(password_file: str | os.PathLike[str] | None = None,
                  secrets_file: str | os.PathLike[str] | None = None) -> str | None:
    """The database password: the whole (stripped) ``password_file``, else the ``store_password``
    entry of the JSON secrets file, else None (libpq's ``~/.pgpass`` may still have one).

    Raises:
        StoreError: a file that is missing, not private (0600, this user's), or malformed.
    """
    if password_file:
        path = Path(password_file).expanduser()
        value = _private_bytes(path, "store password file").decode("utf-8", "replace").strip()
        if not value or "\n" in value:
            raise StoreError(f"the store password file {path} must hold the password alone, on one line")
        return value
    if secrets_file:
        path = Path(secrets_file).expanduser()
        if not path.exists():
            return None
        try:
            data = json.loads(_private_bytes(path, "secrets file"))
        except ValueError:
            raise StoreError(f"the secrets file {path} is not valid JSON") from None
        value = data.get("store_password") if isinstance(data, dict) else None
        if value is not None and (not isinstance(value, str) or not value):
            raise StoreError(f"store_password in {path} must be a non-empty string")
        return value
    return None


def _shown(url: str) -> str:
    """The URL as it may be logged: host, port, database and user, never a password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return "postgresql://(unparsable URL)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


def _failure(exc: BaseException, where: str) -> StorageUnavailable:
    """The STORAGE_FULL / STORAGE_ERROR refusal for a failed database operation."""
    from ..core.errors import Code

    sqlstate = getattr(getattr(exc, "diag", None), "sqlstate", None) or getattr(exc, "sqlstate", None) or ""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if sqlstate in ("53100", "53200"):  # disk_full, out_of_memory
        return StorageUnavailable(
            Code.STORAGE_FULL, f"the relay database ({where}) is out of space, so relay cannot record anything; "
            "ask its administrator to free space, then run the cell again", data={"path": where})
    return StorageUnavailable(
        Code.STORAGE_ERROR, f"relay could not use its database ({where}: {first}); check that the database "
        "server is up and reachable, then run the cell again", data={"path": where})


class PgDatabase(SqlStore):
    """Pool, clock and transactions; the PostgreSQL store's parts build on this."""

    sql = POSTGRES

    def __init__(self, pool: Any, where: str, clock: Callable[[], float]) -> None:
        self._pool = pool
        self._clock = clock
        self._local = threading.local()
        self._closed = False
        self.path = where
        """The database as it may be shown (no password); ``where`` of storage errors."""
        self.storage_problem: StorageUnavailable | None = None

    # -- connections and transactions ------------------------------------------------------
    def _current(self) -> Any:
        return getattr(self._local, "conn", None)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self._closed:
            raise StoreError("the relay store is closed")
        import psycopg
        import psycopg_pool

        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.errors.DiskFull, psycopg_pool.PoolTimeout,
                psycopg.InterfaceError) as exc:
            raise self._failed(exc) from exc

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction on one pooled connection. Nested in another transaction of this store
        on the same thread it is a SAVEPOINT (the outer one commits everything together).

        Raises:
            StorageUnavailable: the database could not be reached or written (STORAGE_FULL when it is
                out of space); :attr:`storage_problem` is set until a later write commits.
        """
        conn = self._current()
        if conn is not None:
            with conn.transaction():
                yield conn
            return
        with self._outermost() as conn, conn.transaction():
            yield conn
        self.storage_problem = None

    @contextmanager
    def snapshot(self) -> Iterator[Any]:
        """A read transaction: several SELECTs see one consistent state (REPEATABLE READ)."""
        conn = self._current()
        if conn is not None:
            yield conn
            return
        with self._outermost() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    @contextmanager
    def _outermost(self) -> Iterator[Any]:
        """A pooled connection bound to this thread while it is used: the store's methods called
        meanwhile (same thread) join its transaction."""
        with self._connection() as conn:
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One SELECT (in the current transaction of this thread, if any)."""
        conn = self._current()
        if conn is not None:
            return conn.execute(sql, params).fetchall()
        with self._connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _failed(self, exc: BaseException) -> StorageUnavailable:
        error = _failure(exc, self.path)
        self.storage_problem = error
        return error

    def now(self) -> float:
        return self._clock()

    def check_space(self) -> None:
        """Nothing to measure locally: the database server reports a full disk on the write itself."""

    def close(self) -> None:
        """Close the pool. Idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PostgresStore(GrantsMixin, EventRows, JournalMixin, ConversationsMixin, TrustMixin, LeasesMixin,
                    TelemetryMixin, TeamLimitsMixin, PgDatabase):
    """The PostgreSQL store. Create with :meth:`open`; close with :meth:`close`.

    With a ``namespace`` (a user name: per-user brokers sharing one database), everything of this
    store lives in the schema ``relay_u_<namespace>`` (two users' notebooks of the same name never
    meet: grants, conversations, runs, events, trust, checkpoints and leases are theirs alone), and
    what users share lives in ``relay_shared``: the ledger rows and holds of teams (``team:<name>``)
    and the audit copy (what team views query). Without one, everything is in the connection's
    default schema.
    """

    owner_id: str | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    _shared: str = ""
    """``relay_shared.`` when namespaced (the prefix of the shared tables), else ``""``."""
    schema: str | None = None

    def _ls(self, key: str) -> str:
        """The schema prefix of the ledger rows and holds of ``key``: teams' are shared."""
        return self._shared if key.startswith(TEAM_PREFIX) else ""

    def _hold_schema(self, hold_id: str) -> str:
        """A hold id starting with ``t`` is a hold in the shared (team) schema."""
        return self._shared if hold_id.startswith("t") else ""

    @classmethod
    def open(cls, url: str, *, password: str | None = None, password_file: str | os.PathLike[str] | None = None,
             secrets_file: str | os.PathLike[str] | None = None, clock: Callable[[], float] = time.time,
             min_size: int = POOL_MIN, max_size: int = POOL_MAX,
             statement_timeout_ms: int = STATEMENT_TIMEOUT_MS, namespace: str | None = None) -> PostgresStore:
        """Connect (a pool of ``min_size``..``max_size`` connections) and migrate.

        Raises:
            StoreError: a password in the URL, an unsafe password file, an unreachable server or a
                refused login (the message shows the URL without any password).
            SchemaError: the database was written by a newer relay-jupyter.
        """
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreError("the PostgreSQL store needs psycopg: pip install 'relay-jupyter[postgres]'") from exc
        if not is_postgres_url(url):
            raise StoreError("store_url must start with postgresql://")
        try:
            parts = conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise StoreError("store_url is not a valid PostgreSQL URL") from None
        shown = _shown(url)
        if parts.get("password"):
            raise StoreError(f"store_url carries a password: remove it from the URL ({shown}) and put it in "
                             "c.RelayApp.store_password_file (mode 0600) or the secrets file's store_password")
        if password is None:
            password = read_password(password_file, secrets_file)
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": "relay-jupyter",
                                  "options": f"-c statement_timeout={int(statement_timeout_ms)}",
                                  "connect_timeout": CONNECT_TIMEOUT}
        if password is not None:
            kwargs["password"] = password
        schema = schema_for(namespace) if namespace is not None else None
        if schema is not None:
            kwargs["options"] += f" -c search_path={schema}"
        # one probe connection first: a refused login or an unreachable host is one clear error at
        # start, not a pool retrying in the background
        try:
            with psycopg.connect(url, **kwargs) as conn:
                if schema is None:
                    migrate(conn, where=shown)
                else:
                    for name in (SHARED_SCHEMA, schema):
                        with conn.transaction():
                            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
                        conn.execute(f"SET search_path TO {name}")
                        migrate(conn, where=f"{shown} (schema {name})")
                    conn.execute(f"INSERT INTO {SHARED_SCHEMA}.namespaces (schema_name, name, first_seen) "
                                 "VALUES (%s, %s, %s) ON CONFLICT (schema_name) DO NOTHING",
                                 (schema, namespace, time.time()))
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1 if "FATAL" not in str(exc) else 0]
            raise StoreError(f"cannot open the relay database {shown}: {first.strip()}", data={"url": shown}) from None
        pool = ConnectionPool(url, kwargs=kwargs, min_size=min_size, max_size=max_size, timeout=POOL_TIMEOUT,
                              check=ConnectionPool.check_connection, open=False, name="relay-store")
        pool.open(wait=True, timeout=POOL_TIMEOUT)
        store = cls(pool, shown, clock)
        if schema is not None:
            store.schema, store._shared = schema, SHARED_SCHEMA + "."
        return store

    @property
    def checkpoints(self) -> PgCheckpointJournal:
        """The checkpoint journal in this database; new checkpoints carry this store's lease."""
        journal = self.__dict__.get("_checkpoints")
        if journal is None:  # two store threads at once make one journal (setdefault is atomic)
            journal = self.__dict__.setdefault("_checkpoints", PgCheckpointJournal(self))
        return journal

    # -- ledger and holds ------------------------------------------------------------------------
    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        """Charge expired holds (a transaction of their own unless nested), then in one transaction
        lock the ledger row of ``origin``/``day``, read its usage and live holds, ``check`` them (it
        raises to refuse: rolled back) and insert the hold. The row lock makes check and insert
        atomic across every broker on the database. Returns the hold's id."""
        check_text("origin", origin)
        check_text("day", day)
        check_amount("tokens", tokens)
        check_amount("cost_usd", cost_usd)
        sch = self._ls(origin)
        if not sch:  # "@owner": charged at once when that broker is found dead
            hold_id = new_hold_id(self.owner_id)
        else:  # "t": in the shared (team) schema; "@owner@schema": that broker's lease is in its user's schema
            hold_id = new_hold_id(f"{self.owner_id}@{self.schema}" if self.owner_id else None, "t")
        if self._current() is None:
            self.sweep_holds(now)
        with self.transaction() as conn:
            if self._current() is not conn:  # pragma: no cover - defensive
                raise StoreError("budget hold outside its transaction")
            used = conn.execute(
                f"INSERT INTO {sch}ledger AS l (origin, day) VALUES (%s, %s) ON CONFLICT (origin, day) "
                "DO UPDATE SET tokens = l.tokens RETURNING tokens, cost_usd", (origin, day)).fetchone()
            held = conn.execute(f"SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost_usd), 0) FROM {sch}budget_holds "
                                "WHERE origin = %s AND day = %s AND NOT charged", (origin, day)).fetchone()
            check(int(used[0]), float(used[1]), int(held[0]), float(held[1]))
            conn.execute(f"INSERT INTO {sch}budget_holds (hold_id, origin, day, tokens, cost_usd, created_at, expires_at) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                         (hold_id, origin, day, int(tokens), float(cost_usd), float(now), float(expires_at)))
        return hold_id

    def sweep_holds(self, now: float) -> int:
        """Expired holds of this schema, then (namespaced) of the shared one: a transaction each."""
        with self.transaction() as conn:
            n = sweep_expired(self, conn, now)
        if self._shared:
            with self.transaction() as conn:
                n += sweep_expired(self, conn, now, self._shared)
        return n

    def charge_dead_holds(self) -> int:
        """The holds of this schema's dead brokers, then (namespaced) the team holds in the shared
        schema of **any** user's dead broker, as SQLite's brokers sharing one file do: a team hold's id
        carries ``@<owner>@relay_u_<user>`` and that owner is judged by the lease in its user's schema
        (issue 12: a SIGKILLed broker's team holds no longer wait for their expiry). A team hold without
        an owner (an older relay-jupyter's ``t<random>``) is charged when no live lease in any user's
        schema started before it was taken."""
        n = charge_dead(self, "", self.live_lease_starts)
        if self._shared:
            n += charge_dead(self, self._shared, self._team_live_leases)
        return n

    def _team_live_leases(self) -> dict[str, float]:
        """``<owner>@<schema>`` of the live brokers among those the live team holds name, each with the
        time its lease started (their leases read from their users' schemas; a schema no namespace
        opened has no live broker); of every user's schema when a hold names no owner."""
        holds = [h for (h,) in self.query(f"SELECT hold_id FROM {self._shared}budget_holds WHERE NOT charged")]
        known = {r[0] for r in self.query(f"SELECT schema_name FROM {self._shared}namespaces")}
        named = known if any(hold_owner(h) is None for h in holds) else \
            {h.rpartition("@")[2] for h in holds if h.count("@") == 2}
        now = self.now()
        live: dict[str, float] = {}
        for schema in sorted(named & known):
            if not _SCHEMA_NAME.match(schema):  # only names schema_for() makes go into SQL text
                continue
            for row in self.query(f"SELECT {', '.join(LEASE_COLUMNS)} FROM {schema}.owners"):
                lease = dict(zip(LEASE_COLUMNS, row, strict=True))
                if owner_alive(lease, now, me=self.owner_id):
                    live[f"{lease['owner_id']}@{schema}"] = float(lease["started_at"])
        if self.owner_id is not None and self.schema is not None:
            live.setdefault(f"{self.owner_id}@{self.schema}", now)
        return live

    def ledger_rows(self, prefix: str = "") -> list[tuple[str, str, int, float]]:
        """``(key, day, tokens, cost_usd)`` of every ledger row whose key starts with ``prefix``
        (the admin view of spend per user and team)."""
        rows = self.query(f"SELECT origin, day, tokens, cost_usd FROM {self._ls(prefix)}ledger "
                          "WHERE starts_with(origin, %s) ORDER BY origin, day", (prefix,))
        return [(o, d, int(t), float(c)) for o, d, t, c in rows]

    def spend_rows(self, since: str | None = None) -> list[dict[str, Any]]:
        """The admin view of spend: per UTC day (from ``since``, an ISO date, on), one row per user —
        ``{"user", "team": None, "day", "tokens", "cost_usd"}``, the sum of their notebooks' ledger rows,
        for every namespace that opened this database — and one per team (``"user": None``). Without
        namespaces, one row per origin key instead of per user (``"user"`` is the origin)."""
        since = since or "0000-00-00"
        out: list[dict[str, Any]] = []
        team_sql = (f"SELECT origin, day, tokens, cost_usd FROM {self._shared}ledger WHERE starts_with(origin, %s) "
                    "AND length(day) = 10 AND day >= %s ORDER BY day, origin")
        for key, day, tokens, cost in self.query(team_sql, (TEAM_PREFIX, since)):
            out.append({"user": None, "team": key[len(TEAM_PREFIX):], "day": day, "tokens": int(tokens),
                        "cost_usd": float(cost)})
        if not self._shared:
            rows = self.query("SELECT origin, day, tokens, cost_usd FROM ledger WHERE NOT starts_with(origin, %s) "
                              "AND length(day) = 10 AND day >= %s ORDER BY day, origin", (TEAM_PREFIX, since))
            out += [{"user": o, "team": None, "day": d, "tokens": int(t), "cost_usd": float(c)} for o, d, t, c in rows]
        else:
            for schema, name in self.query(f"SELECT schema_name, name FROM {self._shared}namespaces ORDER BY name"):
                if not _SCHEMA_NAME.match(schema):  # only names schema_for() makes go into SQL text
                    continue
                rows = self.query(f"SELECT day, SUM(tokens), SUM(cost_usd) FROM {schema}.ledger "
                                  "WHERE NOT starts_with(origin, %s) AND length(day) = 10 AND day >= %s "
                                  "GROUP BY day ORDER BY day", (TEAM_PREFIX, since))
                out += [{"user": name, "team": None, "day": d, "tokens": int(t), "cost_usd": float(c)}
                        for d, t, c in rows]
        return sorted(out, key=lambda r: (r["day"], r["team"] or "", r["user"] or ""))

    # -- conversations ---------------------------------------------------------------------------
    def _write_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any], *, replace: bool) -> None:
        bodies = [dumps(m) for m in messages]
        now = self.now()
        with self.transaction() as conn:
            # the conversation's row first (locked: two writers of one conversation take turns)
            row = conn.execute(
                "INSERT INTO conversations (conv_id, origin, name, message_count, meta, created_at, updated_at) "
                "VALUES (%s, %s, %s, 0, %s, %s, %s) ON CONFLICT (conv_id) DO UPDATE SET "
                "message_count = conversations.message_count RETURNING message_count",
                (conv_id, origin, name, dumps(meta), now, now)).fetchone()
            count = int(row[0])
            start = append_start(conv_id, count, start, replace=replace)
            if start < count:
                conn.execute("DELETE FROM conversation_messages WHERE conv_id = %s AND seq >= %s", (conv_id, start))
            if bodies:
                with conn.cursor() as cur, cur.copy("COPY conversation_messages (conv_id, seq, body) FROM STDIN") as cp:
                    for n, body in enumerate(bodies):
                        cp.write_row((conv_id, start + n, body))
            conn.execute("UPDATE conversations SET origin = %s, name = %s, meta = %s, updated_at = %s, "
                         "message_count = %s WHERE conv_id = %s",
                         (origin, name, dumps(meta), now, start + len(bodies), conv_id))

    # -- events (the rest is storage/events.EventRows) ---------------------------------------------
    def _take_ids(self, conn: Any, n: int) -> int:
        # the counter's row lock orders appends until commit: ids are committed in id order
        return int(conn.execute("UPDATE event_seq SET last_id = last_id + %s RETURNING last_id",
                                (n,)).fetchone()[0]) - n + 1

    def _insert_events(self, conn: Any, rows: list[tuple[int, float, str, str | None, str | None, bytes]]) -> None:
        with conn.cursor() as cur, cur.copy("COPY events (id, ts, type, origin, run_id, frame) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def _next_id(self, conn: Any) -> int:
        return int(conn.execute("SELECT last_id FROM event_seq").fetchone()[0]) + 1

    def _prune_page(self) -> int:
        return PRUNE_PAGE

    def last_event_id(self) -> int:
        return int(self.query("SELECT last_id FROM event_seq")[0][0])

    # -- audit copy --------------------------------------------------------------------------------
    def append_audit(self, record: AuditRecord) -> None:
        """Store a copy of an audit record (already appended to the broker's local log, whose ``seq`` it keeps)."""
        with self.transaction() as conn:
            conn.execute(f"INSERT INTO {self._shared}audit (local_seq, owner, ts, origin, tool, decision, code, run_id, record) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                         (record.seq, self.owner_id, record.ts, record.origin, record.tool, record.decision,
                          record.code, record.run_id, record.model_dump_json()))

    def audit_records(self, *, origin: str | None = None, origin_prefix: str | None = None,
                      since: float | None = None, limit: int = 1000) -> list[AuditRecord]:
        """Stored audit records, oldest first: of ``origin``, or of origins starting with
        ``origin_prefix`` (a user's: ``user:alice/``), at or after ``since`` (epoch seconds); the
        newest ``limit`` of them."""
        cond, args = where([("origin = ?", origin), ("starts_with(origin, ?)", origin_prefix),
                            ("ts >= ?", None if since is None else float(since))])
        rows = self.query(self.sql(f"SELECT record FROM {self._shared}audit{cond} ORDER BY seq DESC LIMIT ?"),
                          [*args, max(0, operator.index(limit))])
        return [AuditRecord.model_validate_json(r[0]) for r in reversed(rows)]


class PgAuditMirror:
    """The broker's audit sink when the store is PostgreSQL: each record goes to the local JSON-lines
    log first (the tamper-evident copy; its failure fails the action, as without a database), then a
    copy to the database (what team views query). A failed copy is logged and marks the store's
    :attr:`~PgDatabase.storage_problem` (readyz 503) instead of undoing a decision already recorded."""

    def __init__(self, local: Any, store: PostgresStore) -> None:
        self.local = local
        self.store = store

    def append(self, record: AuditRecord) -> AuditRecord:
        stored = self.local.append(record)
        try:
            self.store.append_audit(stored)
        except StoreError as exc:
            log.warning("relay: the database copy of audit record %s failed: %s", stored.seq, exc.message)
        return stored

    def tail(self, n: int = 100, *, origin: str | None = None,
             where: Callable[[AuditRecord], bool] | None = None) -> list[AuditRecord]:
        return self.local.tail(n, origin=origin, where=where)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)

    def close(self) -> None:
        self.local.close()


class PgCheckpointJournal(CheckpointRows):
    """:class:`~relay_jupyter.storage.checkpoints.CheckpointJournal` in the PostgreSQL database: the
    same methods (``CheckpointRows``), in the table ``checkpoints`` (pre-images are ``bytea``); each
    write is its own committed transaction of the store."""

    _table = "checkpoints"

    def __init__(self, store: PostgresStore) -> None:
        self.store = self._database = store
        self.db_path = store.path

    @property
    def owner(self) -> str | None:
        return self.store.owner_id

    def close(self) -> None:
        """The store owns the pool."""

    def _writing(self) -> AbstractContextManager[Any]:
        return self.store.transaction()

    def _lease_rows(self) -> list[dict[str, Any]]:
        return self.store.leases()


assert STATES == ("prepared", "applied", "reverting", "reverted")  # the CHECK constraint of pg_schema
