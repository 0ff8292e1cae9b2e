"""Keyed records of the store: grants, the budget ledger and its holds, conversations, saved trust, tool pins."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping
from typing import Any

from ..core.memory import charge_totals, check_conversation, check_tool_key, held_by_dead, settle_charge
from ..core.types import Grant, ToolClass
from ._db import check_amount, check_text
from .dialect import SqlStore

__all__ = ["ConversationsMixin", "GrantsMixin", "TrustMixin"]


class GrantsMixin(SqlStore):
    """``GrantStore`` and ``Ledger`` (both stores; ``hold`` is each store's own: how the check and the
    insert are made atomic is where SQLite and PostgreSQL really differ)."""

    def get_grant(self, origin: str) -> Grant | None:
        """The stored grant of ``origin`` (expired or not), or None."""
        rows = self.query(self.sql("SELECT body FROM grants WHERE origin = ?"), (origin,))
        return Grant.model_validate_json(rows[0][0]) if rows else None

    def put_grant(self, grant: Grant) -> None:
        """Insert or replace the grant of ``grant.origin``. Narrowing checks are ``core``'s job."""
        if not isinstance(grant, Grant):
            raise TypeError(f"put_grant needs a Grant, got {grant.__class__.__name__}")
        with self.transaction() as conn:
            conn.execute(self.sql("INSERT INTO grants (origin, body, updated_at) VALUES (?, ?, ?) ON CONFLICT (origin) "
                                  "DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                         (grant.origin, grant.model_dump_json(), self.now()))

    def delete_grant(self, origin: str) -> bool:
        """Remove the grant of ``origin``; True if there was one."""
        with self.transaction() as conn:
            return conn.execute(self.sql("DELETE FROM grants WHERE origin = ?"), (origin,)).rowcount > 0

    def list_grants(self) -> list[Grant]:
        """Every stored grant, ordered by origin."""
        return [Grant.model_validate_json(r[0]) for r in self.query("SELECT body FROM grants ORDER BY origin")]

    def usage(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) committed so far for ``origin`` on ``day`` (ISO date, UTC)."""
        rows = self.query(self.sql(f"SELECT tokens, cost_usd FROM {self._ls(origin)}ledger WHERE origin = ? AND day = ?"),
                          (origin, day))
        return (int(rows[0][0]), float(rows[0][1])) if rows else (0, 0.0)

    def add_usage(self, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        """Add to the committed usage in one statement (concurrent adds never lose an update).

        Raises ValueError for a negative or non-finite amount: the ledger only grows.
        """
        check_text("origin", origin)
        check_text("day", day)
        check_amount("tokens", tokens)
        check_amount("cost_usd", cost_usd)
        with self.transaction() as conn:
            add_to_ledger(self, conn, origin, day, int(tokens), float(cost_usd), self._ls(origin))

    # -- budget holds (reservations): shared by every broker on the store ----------------------------
    def held(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) held by live reservations of ``origin`` on ``day``."""
        rows = self.query(self.sql(f"SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost_usd), 0) FROM "
                                   f"{self._ls(origin)}budget_holds WHERE origin = ? AND day = ? AND NOT charged"),
                          (origin, day))
        return int(rows[0][0]), float(rows[0][1])

    def finish_hold(self, hold_id: str, tokens: int | None, cost_usd: float | None) -> bool:
        """One transaction: commit ``tokens``/``cost_usd`` (None: nothing, the request was never sent)
        and delete the hold. A hold already charged by :meth:`sweep_holds` adds only what exceeds its
        amount. True when the hold was live (neither finished nor expired)."""
        if tokens is not None:
            check_amount("tokens", tokens)
            check_amount("cost_usd", cost_usd)
        sch = self._hold_schema(hold_id)
        with self.transaction() as conn:
            row = conn.execute(self.sql(f"SELECT origin, day, tokens, cost_usd, charged FROM {sch}budget_holds "
                                        "WHERE hold_id = ?{for_update}"), (hold_id,)).fetchone()
            if row is None:
                return False
            origin, day, held_t, held_c, charged = row
            if tokens is not None and cost_usd is not None:
                add_to_ledger(self, conn, origin, day, *settle_charge(tokens, cost_usd, held_t, held_c, charged), sch)
            conn.execute(self.sql(f"DELETE FROM {sch}budget_holds WHERE hold_id = ?"), (hold_id,))
            return not charged

    def sweep_holds(self, now: float) -> int:
        """Charge every live hold whose ``expires_at`` has passed at its full amount (its broker died:
        the request may have been sent); charged holds are deleted a day after expiry. Returns how many
        were charged."""
        with self.transaction() as conn:
            return sweep_expired(self, conn, now)

    def charge_dead_holds(self) -> int:
        """Charge at its full amount every live hold of a broker whose lease is dead (storage/leases.py),
        as its expiry would, but now: the request it covered may have been sent. Who is dead is judged
        inside the write transaction; a hold with no owner (an older relay-jupyter's) is charged when
        no live lease started before it was taken. Returns how many."""
        return charge_dead(self, "", self.live_lease_starts)


def add_to_ledger(store: SqlStore, conn: Any, origin: str, day: str, tokens: int, cost_usd: float,
                  schema: str = "") -> None:
    """Add to a ledger row in one UPSERT (``schema``: the prefix of a shared schema, or "")."""
    conn.execute(store.sql(
        f"INSERT INTO {schema}ledger AS l (origin, day, tokens, cost_usd) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (origin, day) DO UPDATE SET tokens = l.tokens + excluded.tokens, "
        "cost_usd = l.cost_usd + excluded.cost_usd"), (origin, day, tokens, cost_usd))


def _charge(store: SqlStore, conn: Any, rows: list[tuple[Any, ...]], schema: str) -> None:
    """Charge the holds ``rows`` (``hold_id, origin, day, tokens, cost_usd``) in full and mark them
    charged: their ledger rows are added to in key order (PostgreSQL: two brokers charging at once
    lock the rows in one order, so they never deadlock)."""
    for origin, day, tokens, cost in charge_totals(r[1:] for r in rows):
        add_to_ledger(store, conn, origin, day, tokens, cost, schema)
    store.sql.executemany(conn, store.sql(f"UPDATE {schema}budget_holds SET charged = TRUE WHERE hold_id = ?"),
                          [(r[0],) for r in rows])


def sweep_expired(store: SqlStore, conn: Any, now: float, schema: str = "") -> int:
    """Charge the expired live holds in ``schema``; forget charged holds a day after their expiry.
    The rows are read ``{for_update}`` in key order: a second sweeper waits, then sees them charged."""
    expired = conn.execute(store.sql(f"SELECT hold_id, origin, day, tokens, cost_usd FROM {schema}budget_holds "
                                     "WHERE NOT charged AND expires_at <= ? ORDER BY origin, day, hold_id{for_update}"),
                           (now,)).fetchall()
    if expired:
        _charge(store, conn, expired, schema)
    conn.execute(store.sql(f"DELETE FROM {schema}budget_holds WHERE charged AND expires_at <= ?"), (now - 86400.0,))
    return len(expired)


def charge_dead(store: SqlStore, schema: str, live_leases: Callable[[], Mapping[str, float]]) -> int:
    """Charge in full, now, the live holds in ``schema`` of dead brokers (``core.memory.held_by_dead``:
    the ``@owner`` of the id is not among ``live_leases()``, owner key -> lease start; or, a hold
    without an owner, no live lease started before it was taken); the owners are judged again inside
    the write transaction. Returns how many."""
    rows = store.query(f"SELECT hold_id, created_at FROM {schema}budget_holds WHERE NOT charged")
    if not rows:
        return 0
    live = live_leases()
    if not any(held_by_dead(h, live, c) for h, c in rows):
        return 0
    with store.transaction() as conn:
        live = live_leases()
        found = conn.execute(store.sql(f"SELECT hold_id, origin, day, tokens, cost_usd, created_at "
                                       f"FROM {schema}budget_holds WHERE NOT charged "
                                       "ORDER BY origin, day, hold_id{for_update}")).fetchall()
        dead = [r[:5] for r in found if held_by_dead(r[0], live, r[5])]
        if dead:
            _charge(store, conn, dead, schema)
    return len(dead)


class ConversationsMixin(SqlStore):
    """Conversations, append-only (schema 5): a row of ``conversations`` with the name, metadata and
    ``message_count``, and a row of ``conversation_messages`` per message. A turn writes only the
    messages it adds (:meth:`append_messages`), so its cost does not grow with the history. How the
    rows are written (``_write_messages``) is each store's own."""

    def save_conversation(self, conv_id: str, origin: str, name: str, messages: list[dict[str, Any]],
                          meta: dict[str, Any]) -> None:
        """Insert or replace the whole conversation (fork, migration); ``created_at`` is kept."""
        check_conversation(conv_id, origin, name, messages, meta)
        self._write_messages(conv_id, origin, name, 0, messages, meta, replace=True)

    def append_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """Store ``messages`` as messages ``start, start + 1, …`` (those from ``start`` on are
        replaced, earlier ones kept); one transaction. ValueError when ``start`` is beyond the
        stored count."""
        check_conversation(conv_id, origin, name, messages, meta)
        start = operator.index(start)
        if start < 0:
            raise ValueError("start must be >= 0")
        self._write_messages(conv_id, origin, name, start, messages, meta, replace=False)

    def _write_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any], *, replace: bool) -> None:
        raise NotImplementedError

    def load_conversation(self, conv_id: str) -> dict[str, Any] | None:
        """``{conv_id, origin, name, messages, meta, created_at, updated_at}`` or None."""
        with self.snapshot() as conn:
            row = conn.execute(self.sql("SELECT conv_id, origin, name, meta, created_at, updated_at "
                                        "FROM conversations WHERE conv_id = ?"), (conv_id,)).fetchone()
            if row is None:
                return None
            bodies = conn.execute(self.sql("SELECT body FROM conversation_messages WHERE conv_id = ? ORDER BY seq"),
                                  (conv_id,)).fetchall()
        cid, origin, name, meta, created, updated = row
        # one json.loads over the joined rows: a parse per message costs more than the join
        messages = json.loads("[" + ",".join([b[0] for b in bodies]) + "]")
        return {"conv_id": cid, "origin": origin, "name": name, "messages": messages,
                "meta": json.loads(meta), "created_at": created, "updated_at": updated}

    def conversation_origin(self, conv_id: str) -> str | None:
        """The origin of a stored conversation, without reading its messages."""
        rows = self.query(self.sql("SELECT origin FROM conversations WHERE conv_id = ?"), (conv_id,))
        return rows[0][0] if rows else None

    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """Summaries (no messages; ``message_count`` instead), most recently updated first."""
        sql = "SELECT conv_id, origin, name, message_count, meta, created_at, updated_at FROM conversations"
        rows = self.query(self.sql(sql + " ORDER BY updated_at DESC, {seq} DESC")) if origin is None else \
            self.query(self.sql(sql + " WHERE origin = ? ORDER BY updated_at DESC, {seq} DESC"), (origin,))
        return [{"conv_id": c, "origin": o, "name": n, "message_count": k, "meta": json.loads(m),
                 "created_at": ca, "updated_at": ua} for c, o, n, k, m, ca, ua in rows]

    def delete_conversation(self, conv_id: str) -> bool:
        """Remove a conversation and its messages; True if it existed. Its runs stay in the journal."""
        with self.transaction() as conn:
            conn.execute(self.sql("DELETE FROM conversation_messages WHERE conv_id = ?"), (conv_id,))
            return conn.execute(self.sql("DELETE FROM conversations WHERE conv_id = ?"), (conv_id,)).rowcount > 0


class TrustMixin(SqlStore):
    """Saved trust ("Always allow for this notebook") and MCP tool pins, both bound to a tool digest."""

    def add_trust(self, origin: str, server: str, tool: str, digest: str) -> None:
        """Trust ``(server, tool)`` for ``origin`` while its digest is ``digest`` (replaces an older digest).
        ``server`` is ``""`` for relay's own tools; the key is three columns, never a joined name."""
        check_text("origin", origin)
        check_tool_key(server, tool, builtin_ok=True)
        check_text("digest", digest)
        with self.transaction() as conn:
            conn.execute(self.sql("INSERT INTO trust (origin, server, tool, digest, created_at) VALUES (?, ?, ?, ?, ?) "
                                  "ON CONFLICT (origin, server, tool) DO UPDATE SET digest = excluded.digest, "
                                  "created_at = excluded.created_at"), (origin, server, tool, digest, self.now()))

    def has_trust(self, origin: str, server: str, tool: str, digest: str) -> bool:
        """True only when ``origin`` trusts ``(server, tool)`` with exactly this digest."""
        return bool(self.query(self.sql("SELECT 1 FROM trust WHERE origin = ? AND server = ? AND tool = ? "
                                        "AND digest = ?"), (origin, server, tool, digest)))

    def list_trust(self, origin: str | None = None) -> list[dict[str, Any]]:
        """``[{origin, server, tool, digest, created_at}]`` ordered by origin, server, tool."""
        sql = "SELECT origin, server, tool, digest, created_at FROM trust"
        rows = self.query(sql + " ORDER BY origin, server, tool") if origin is None else \
            self.query(self.sql(sql + " WHERE origin = ? ORDER BY server, tool"), (origin,))
        return [{"origin": o, "server": sv, "tool": t, "digest": d, "created_at": c} for o, sv, t, d, c in rows]

    def revoke_trust(self, origin: str, *, server: str | None = None, tool: str | None = None) -> int:
        """Forget the trust of ``origin``: all (both None), one server's, or ``(server, tool)``."""
        if tool is not None and server is None:
            raise ValueError("revoke_trust: a tool is named by (server, tool); pass server ('' for relay's own)")
        with self.transaction() as conn:
            if server is None:
                return conn.execute(self.sql("DELETE FROM trust WHERE origin = ?"), (origin,)).rowcount
            if tool is None:
                return conn.execute(self.sql("DELETE FROM trust WHERE origin = ? AND server = ?"),
                                    (origin, server)).rowcount
            return conn.execute(self.sql("DELETE FROM trust WHERE origin = ? AND server = ? AND tool = ?"),
                                (origin, server, tool)).rowcount

    def put_pin(self, server: str, tool: str, digest: str, tool_class: ToolClass | str) -> None:
        """Pin MCP tool ``(server, tool)`` (the server's own tool name) to ``tool_class`` while its digest
        is ``digest``. Raises ValueError for an unknown class."""
        check_tool_key(server, tool, builtin_ok=False)
        check_text("digest", digest)
        cls = ToolClass(tool_class)
        with self.transaction() as conn:
            conn.execute(self.sql("INSERT INTO pins (server, tool, digest, tool_class, created_at) "
                                  "VALUES (?, ?, ?, ?, ?) ON CONFLICT (server, tool) DO UPDATE SET "
                                  "digest = excluded.digest, tool_class = excluded.tool_class, "
                                  "created_at = excluded.created_at"), (server, tool, digest, cls.value, self.now()))

    def get_pin(self, server: str, tool: str) -> tuple[str, ToolClass] | None:
        """``(digest, class)`` of the pin of ``(server, tool)``, or None. The caller compares the digest."""
        rows = self.query(self.sql("SELECT digest, tool_class FROM pins WHERE server = ? AND tool = ?"), (server, tool))
        return (rows[0][0], ToolClass(rows[0][1])) if rows else None

    def delete_pin(self, server: str, tool: str) -> bool:
        """Remove the pin of ``(server, tool)``; True if there was one."""
        with self.transaction() as conn:
            return conn.execute(self.sql("DELETE FROM pins WHERE server = ? AND tool = ?"), (server, tool)).rowcount > 0

    def list_pins(self) -> list[dict[str, Any]]:
        """``[{server, tool, digest, tool_class, created_at}]`` ordered by server, tool."""
        rows = self.query("SELECT server, tool, digest, tool_class, created_at FROM pins ORDER BY server, tool")
        return [{"server": sv, "tool": t, "digest": d, "tool_class": ToolClass(c), "created_at": ts}
                for sv, t, d, c, ts in rows]
