"""One spelling of the statements both SQL stores run, and the base their shared parts build on.

The SQLite store (storage/sqlite.py) and the PostgreSQL store (storage/postgres.py) run the same
statements for grants, the ledger and its holds, conversations, saved trust, tool pins, the runs
journal, leases, telemetry, team limits and events. Those are written **once**, in the mixins of
``records.py``, ``journal.py``, ``leases.py``, ``telemetry.py``, ``team_limits.py`` and ``events.py``
(``EventRows``), in the SQL both databases accept, with ``?``
placeholders and a few tokens that a :class:`Dialect` spells for its database:

==================  ==========================  ==========================================
token               SQLite                      PostgreSQL
==================  ==========================  ==========================================
``?``               ``?``                       ``%s`` (psycopg's placeholder)
``{seq}``           ``rowid`` (insertion order) ``seq`` (an identity column: insertion order)
``{for_update}``    nothing (one writer: the    `` FOR UPDATE`` (many writers: lock the
                    whole file is locked)       rows read for a write)
``{instr}``         ``instr``                   ``strpos`` (same arguments: text, needle)
==================  ==========================  ==========================================

What really differs stays in each store, explicit: how a budget hold is checked and inserted
atomically (SQLite: ``BEGIN IMMEDIATE``'s write lock; PostgreSQL: the ledger row locked by an
``INSERT … ON CONFLICT DO UPDATE … RETURNING``), how a conversation's messages are written
(``executemany`` vs ``COPY``), how event ids are taken and their rows written (``AUTOINCREMENT``'s
sequence and ``executemany`` vs the PostgreSQL event counter's row lock and ``COPY``), the PostgreSQL
store's team schema, and transactions themselves (storage/_db.py vs ``PgDatabase``). An event replay
page is one statement pair both run in their own snapshot (``EventRows.replay_sse``).

Hand-written rather than a query builder (SQLAlchemy Core): the statements are short and fixed, the
stores' differences are in locking, not in syntax, and the hot paths (events) would pay for a
compiler on every call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

__all__ = ["POSTGRES", "SQLITE", "Dialect", "SqlStore", "where"]

_TOKEN = re.compile(r"\{(seq|for_update|instr)\}")


class Dialect:
    """How one database spells the shared statements (module docstring). ``dialect(sql)`` gives the
    statement for this database; the translation is done once per statement text and kept."""

    __slots__ = ("_cache", "_tokens", "mark", "name")

    def __init__(self, name: str, *, mark: str, seq: str, for_update: str, instr: str) -> None:
        self.name = name
        self.mark = mark
        self._tokens = {"seq": seq, "for_update": for_update, "instr": instr}
        self._cache: dict[str, str] = {}

    def __call__(self, sql: str) -> str:
        try:
            return self._cache[sql]
        except KeyError:
            pass
        if "%" in sql:
            # psycopg reads "%" as the start of a placeholder: a literal one would need "%%" there
            # and "%" in SQLite, so shared statements simply have none
            raise ValueError(f"a shared statement must not contain '%': {sql!r}")
        out = _TOKEN.sub(lambda m: self._tokens[m.group(1)], sql)
        if self.mark != "?":
            out = out.replace("?", self.mark)
        self._cache[sql] = out
        return out

    def marks(self, n: int) -> str:
        """``n`` placeholders, comma-separated (for an ``IN (…)`` or a ``VALUES (…)`` list)."""
        return ",".join([self.mark] * n)

    def executemany(self, conn: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """One statement over many parameter rows (sqlite3 has it on the connection, psycopg on a cursor)."""
        if self.name == "sqlite":
            conn.executemany(sql, rows)
            return
        rows = list(rows)
        if rows:
            with conn.cursor() as cur:
                cur.executemany(sql, rows)

    def insert_id(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        """Run an ``INSERT`` into a table with an ``id`` key and return the new row's id (SQLite:
        ``lastrowid``, no ``RETURNING`` needed — it came with SQLite 3.35 and Python 3.11 may link an
        older one; PostgreSQL: ``RETURNING id``)."""
        if self.name == "sqlite":
            return int(conn.execute(sql, params).lastrowid or 0)
        return int(conn.execute(sql + " RETURNING id", params).fetchone()[0])


def where(conditions: Sequence[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """``(" WHERE a AND b", [values])`` of the ``(clause, value)`` pairs whose value is not None (each
    clause with one ``?``); ``("", [])`` when none is."""
    kept = [(clause, value) for clause, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(c for c, _ in kept), [v for _, v in kept]


SQLITE = Dialect("sqlite", mark="?", seq="rowid", for_update="", instr="instr")
POSTGRES = Dialect("postgresql", mark="%s", seq="seq", for_update=" FOR UPDATE", instr="strpos")


class SqlStore:
    """What the shared mixins use of a store: implemented by ``storage._db.Database`` (SQLite) and
    ``storage.postgres.PgDatabase``, which come before this class in each store's MRO."""

    sql: ClassVar[Dialect]
    owner_id: str | None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def snapshot(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def check_space(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    def live_owners(self) -> set[str]:
        raise NotImplementedError

    def live_lease_starts(self) -> dict[str, float]:
        raise NotImplementedError

    def append_events_framed(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]
                             ) -> tuple[list[Any], list[bytes]]:
        raise NotImplementedError

    def events_since(self, since: int, *, limit: int | None = None, origins: Any = None) -> list[Any]:
        raise NotImplementedError

    def _ls(self, key: str) -> str:
        """The schema prefix of the ledger rows and holds of ``key`` ("": this store's own tables)."""
        return ""

    def _hold_schema(self, hold_id: str) -> str:
        """The schema prefix of the hold ``hold_id`` ("": this store's own tables)."""
        return ""
