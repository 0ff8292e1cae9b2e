"""The embedded store: one SQLite file (WAL) for grants, the ledger, events, runs, conversations,
saved trust and tool pins. See docs/storage.md.

    store = Store.open()            # <jupyter data dir>/relay/relay.db, mode 0600
    store.put_grant(grant)
    store.append_events([...])
    store.close()

Implements :class:`relay_jupyter.core.ports.Store` (every port of the broker's persistence; the
contract suite ``relay_jupyter.testing.store_contract`` checks it). Thread-safe: one connection
behind one lock, shared by the checkpoint journal (:attr:`Store.checkpoints`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.memory import append_start, new_hold_id
from ._db import check_amount, check_text, dumps
from .checkpoints import CheckpointJournal
from .events import EventsMixin
from .journal import JournalMixin
from .leases import LeasesMixin
from .paths import data_dir
from .records import ConversationsMixin, GrantsMixin, TrustMixin, sweep_expired
from .team_limits import TeamLimitsMixin
from .telemetry import TelemetryMixin

__all__ = ["DB_NAME", "Store"]

DB_NAME = "relay.db"


class Store(GrantsMixin, EventsMixin, JournalMixin, ConversationsMixin, TrustMixin, LeasesMixin,
            TelemetryMixin, TeamLimitsMixin):
    """SQLite store. Create with :meth:`open`; use as a context manager or call :meth:`close`.

    A broker takes a lease (:meth:`acquire_lease`, storage/leases.py) right after opening; CLI tools
    that only read or edit grants do not.
    """

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *,
             clock: Callable[[], float] = time.time) -> Store:
        """Open (creating and migrating) the database at ``path``, default ``data_dir() / "relay.db"``.

        ``clock`` stamps events, runs and records (tests pass a fake one).

        Raises:
            StoreError: the file is not a database, cannot use WAL, or is busy.
            SchemaError: the file was written by a newer relay-jupyter.
        """
        where = data_dir() / DB_NAME if path is None else Path(path)
        return cls(cls._connect(where), where, clock)

    _checkpoints: CheckpointJournal | None = None

    @property
    def checkpoints(self) -> CheckpointJournal:
        """The checkpoint journal on this store's connection; its entries carry :attr:`owner_id`."""
        if self._checkpoints is None:
            self._checkpoints = CheckpointJournal(database=self)
        return self._checkpoints

    # -- what is SQLite's own (the shared statements: records.py, journal.py, leases.py, telemetry.py) --
    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        """One ``BEGIN IMMEDIATE`` transaction: charge expired holds, read the day's committed usage
        and live holds, call ``check(used_tokens, used_cost, held_tokens, held_cost)`` (it raises to
        refuse: the transaction rolls back) and insert a hold. SQLite's write lock makes the check and
        the insert atomic across every process on the file. Returns the hold's id."""
        check_text("origin", origin)
        check_text("day", day)
        check_amount("tokens", tokens)
        check_amount("cost_usd", cost_usd)
        hold_id = new_hold_id(self.owner_id)
        with self.transaction() as conn:
            sweep_expired(self, conn, now)
            used = conn.execute("SELECT tokens, cost_usd FROM ledger WHERE origin = ? AND day = ?",
                                (origin, day)).fetchone() or (0, 0.0)
            held = conn.execute("SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost_usd), 0) FROM budget_holds "
                                "WHERE origin = ? AND day = ? AND NOT charged", (origin, day)).fetchone()
            check(int(used[0]), float(used[1]), int(held[0]), float(held[1]))
            conn.execute("INSERT INTO budget_holds (hold_id, origin, day, tokens, cost_usd, created_at, expires_at) "
                         "VALUES (?,?,?,?,?,?,?)", (hold_id, origin, day, int(tokens), float(cost_usd), float(now),
                                                    float(expires_at)))
        return hold_id

    def _write_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any], *, replace: bool) -> None:
        bodies = [dumps(m) for m in messages]  # encoded before taking the write lock
        now = self.now()
        with self.transaction() as conn:
            row = conn.execute("SELECT message_count FROM conversations WHERE conv_id = ?", (conv_id,)).fetchone()
            count = 0 if row is None else int(row[0])
            start = append_start(conv_id, count, start, replace=replace)
            if start < count:
                conn.execute("DELETE FROM conversation_messages WHERE conv_id = ? AND seq >= ?", (conv_id, start))
            conn.executemany("INSERT INTO conversation_messages (conv_id, seq, body) VALUES (?,?,?)",
                             [(conv_id, start + n, b) for n, b in enumerate(bodies)])
            conn.execute(
                "INSERT INTO conversations (conv_id, origin, name, messages, meta, created_at, updated_at, "
                "message_count) VALUES (?,?,?,'[]',?,?,?,?) ON CONFLICT (conv_id) DO UPDATE SET "
                "origin = excluded.origin, name = excluded.name, meta = excluded.meta, "
                "updated_at = excluded.updated_at, message_count = excluded.message_count",
                (conv_id, origin, name, dumps(meta), now, now, start + len(bodies)))
