"""The event store: append (one or a batch per transaction), replay since an id, retention.

Each row keeps the event as its finished SSE frame (``frame``, UTF-8), byte-identical to
:func:`relay_jupyter.protocol.sse.encode_event`: ``id: N\nevent: TYPE\ndata: {"id":N,"ts":…,"type":…,
"origin":…,"run_id":…,"data":…}\n\n``. Replay is then a range read and a ``bytes.join``, with no
JSON decoding or encoding: that is what keeps replaying 10k events under 10 ms (docs/storage.md).
``events_since`` parses the ``data:`` line back into :class:`~relay_jupyter.core.types.Event`.
The ``ts``, ``type``, ``origin`` and ``run_id`` columns repeat what the frame holds, for retention
and visibility filters.

:class:`EventRows` is that store for both databases (storage/dialect.py); each gives how ids are
taken and rows written, and its replay page (SQLite: :class:`EventsMixin` here; PostgreSQL:
storage/postgres.py, ids from the ``event_seq`` counter and rows by ``COPY``).

On SQLite ids come from ``AUTOINCREMENT``: strictly increasing, never reused after pruning. Retention
removes a prefix (the oldest events), so the retained ids stay contiguous and a client whose
``since`` is below ``first_event_id() - 1`` knows it missed events.
"""

from __future__ import annotations

import json
import operator
import sqlite3
import time
from collections.abc import Collection, Sequence
from json.encoder import encode_basestring
from typing import Any

from ..core.types import Event
from ..protocol.names import EventType
from ..core.memory import check_event
from ._db import Database, dumps
from .dialect import SqlStore

__all__ = ["PRUNE_PAGE", "EventRows", "EventsMixin", "checked_items", "visibility"]

PRUNE_PAGE = 500
"""Events deleted per transaction by the SQLite store's :meth:`EventRows.prune_events`: measured here (2 cores, load
about 6) a page holds the write lock 3-9 ms (median), longer when SQLite's WAL auto-checkpoint falls
into it; between pages the pruning thread sleeps a millisecond, so the loop's appends get the lock."""

_PERMISSION_TYPES = frozenset({EventType.PERMISSION_REQUEST, EventType.PERMISSION_RESOLVED,
                               EventType.PERMISSION_TIMEOUT})


def middles_types(middles: dict[tuple[str, str | None, str | None], str]) -> set[str]:
    """The event types of a batch (its ``middles`` are keyed by type, origin, run id)."""
    return {key[0] for key in middles}


def _js(value: str | None) -> str:
    """A JSON string literal (or null), as json.dumps(ensure_ascii=False) writes it."""
    return "null" if value is None else encode_basestring(value)


def _middle(type: str, origin: str | None, run_id: str | None) -> str:
    """The part of an event's JSON between ``ts`` and the ``data`` value (shared by a run's events)."""
    return f',"type":{_js(type)},"origin":{_js(origin)},"run_id":{_js(run_id)},"data":'


def _parse(frame: bytes) -> Event:
    """The Event in a stored frame (its ``data:`` line; the type has no newline, so the first one is it)."""
    start = frame.index(b"\ndata: ") + 7
    return Event(**json.loads(frame[start:-2]))


def _event(fields: dict[str, Any]) -> Event:
    """An Event from values ``append_events`` has just checked (every field given, of the right type):
    pydantic's public ``model_construct`` skips validating them a second time (issue 14 item 7: no
    writes to pydantic's private attributes); ``tests/storage/test_events.py`` checks the result
    equals a validated Event."""
    return Event.model_construct(**fields)


def checked_items(items: Sequence[Any]) -> list[Any]:
    """The events of one append as a list, each checked (``core.memory.check_event``: TypeError /
    ValueError, and nothing of the batch is written); the common, valid case in one expression."""
    items = list(items)
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 4:
            raise TypeError("each event must be a (type, data, origin, run_id) tuple")
        t, d, o, r = item
        # the detailed checks only name what is wrong
        if not (type(t) is str and t and "\n" not in t and "\r" not in t and "\x00" not in t
                and type(d) is dict and (o is None or (type(o) is str and o and "\x00" not in o))
                and (r is None or (type(r) is str and r and "\x00" not in r))):
            check_event(t, d, o, r)
    return items


def visibility(mark: str, origins: Collection[str] | None) -> tuple[str, list[Any]]:
    """SQL filter for what a caller may see: broadcast events plus those of ``origins`` (None = all),
    with the placeholder ``mark`` of the database (origins are always bound, never SQL text)."""
    if origins is None:
        return "", []
    origins = list(origins)
    if not origins:
        return " AND origin IS NULL", []
    return f" AND (origin IS NULL OR origin IN ({','.join([mark] * len(origins))}))", origins


_UPSERT_PENDING = ("INSERT INTO pending_permissions (request_id, owner, origin, run_id, event_id, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE SET owner = excluded.owner, "
                   "origin = excluded.origin, run_id = excluded.run_id, event_id = excluded.event_id, "
                   "created_at = excluded.created_at")


class EventRows(SqlStore):
    """``EventStore`` over the ``events`` table, for both stores: the append (frames built before the
    write transaction), the pending permissions kept in its transaction, reads since an id and
    retention. Each store gives how ids are taken and rows written (SQLite: ``AUTOINCREMENT``'s
    sequence and ``executemany``; PostgreSQL: the ``event_seq`` counter's row lock and ``COPY``),
    ``last_event_id``, ``replay_sse`` and what follows a pruned page."""

    def append_event(self, type: str, data: dict[str, Any], *, origin: str | None = None,
                     run_id: str | None = None) -> Event:
        """Append one event; returns it with its id. Raises TypeError / ValueError for a malformed event."""
        return self.append_events([(type, data, origin, run_id)])[0]

    def append_events(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]) -> list[Event]:
        """Append ``(type, data, origin, run_id)`` tuples in one transaction (all or none).

        Raises TypeError / ValueError when any item is malformed; nothing is written then.
        """
        return self._append(items)[0]

    def append_events_framed(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]
                             ) -> tuple[list[Event], list[bytes]]:
        """:meth:`append_events`, also returning each event's stored SSE frame (``encode_event(event)``
        byte for byte), so the event bus delivers it live without encoding it a second time."""
        return self._append(items)

    def _append(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]
                ) -> tuple[list[Event], list[bytes]]:
        items = checked_items(items)
        if not items:
            return [], []
        ts = float(self.now())
        head = f'"ts":{ts!r}'
        middles: dict[tuple[str, str | None, str | None], str] = {}
        tails: list[str] = []
        for t, d, o, r in items:
            key = (t, o, r)
            middle = middles.get(key)
            if middle is None:
                middle = middles[key] = _middle(t, o, r)
            # the costly part (encoding data), done before taking the write lock
            tails.append(f"{head}{middle}{dumps(d)}}}\n\n")
        with self.transaction() as conn:
            # ids are chosen here, inside the write transaction, so each frame can carry its own id
            first = self._take_ids(conn, len(items))
            rows = [(first + n, ts, t, o, r, f'id: {first + n}\nevent: {t}\ndata: {{"id":{first + n},{tail}'.encode())
                    for n, ((t, _, o, r), tail) in enumerate(zip(items, tails, strict=True))]
            self._insert_events(conn, rows)
            if _PERMISSION_TYPES.intersection(middles_types(middles)):
                self._track_permissions(conn, items, first, ts)
        # data is copied (shallow), as validation would: a caller changing its dict later does not
        # change the returned event
        events = [_event({"id": first + n, "ts": ts, "type": t, "origin": o, "run_id": r, "data": dict(d)})
                  for n, (t, d, o, r) in enumerate(items)]
        return events, [row[5] for row in rows]

    def _take_ids(self, conn: Any, n: int) -> int:
        """The first of ``n`` new consecutive ids, inside the append's transaction (never reused)."""
        raise NotImplementedError

    def _insert_events(self, conn: Any, rows: list[tuple[int, float, str, str | None, str | None, bytes]]) -> None:
        """Write the rows ``(id, ts, type, origin, run_id, frame)``."""
        raise NotImplementedError

    def _next_id(self, conn: Any) -> int:
        """The id the next event gets (newest id ever handed out + 1)."""
        raise NotImplementedError

    def _track_permissions(self, conn: Any, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]],
                           first: int, ts: float) -> None:
        """Keep ``pending_permissions`` in step with the events, in their transaction: a request is
        pending (with this store's owner) from its ``permission.request`` until its
        ``permission.resolved`` / ``permission_timeout``. Recovery answers what a dead broker left."""
        owner = self.owner_id
        for n, (t, d, o, r) in enumerate(items):
            request_id = d.get("request_id")
            if t not in _PERMISSION_TYPES or not isinstance(request_id, str):
                continue
            if t == EventType.PERMISSION_REQUEST:
                conn.execute(self.sql(_UPSERT_PENDING), (request_id, owner, o, r, first + n, ts))
            else:
                conn.execute(self.sql("DELETE FROM pending_permissions WHERE request_id = ?"), (request_id,))

    def _rows_since(self, since: int, limit: int | None, origins: Collection[str] | None) -> list[tuple[Any, ...]]:
        since = operator.index(since)
        mark = self.sql.mark
        where, params = visibility(mark, origins)
        sql = f"SELECT id, frame FROM events WHERE id > {mark}{where} ORDER BY id"
        args: list[Any] = [since, *params]
        if limit is not None:
            limit = operator.index(limit)
            if limit <= 0:
                return []
            sql += f" LIMIT {mark}"
            args.append(limit)
        return self.query(sql, args)

    def events_since(self, since: int, *, limit: int | None = None,
                     origins: Collection[str] | None = None) -> list[Event]:
        """Events with id > ``since``, oldest first; at most ``limit``.

        ``origins`` restricts the result to broadcast events and those of the given origins
        (None: every event). A negative ``since`` replays from the start; one beyond the newest
        id gives ``[]``. Raises TypeError when ``since`` or ``limit`` is not an integer.
        """
        return [_parse(bytes(frame)) for _, frame in self._rows_since(since, limit, origins)]

    def replay_sse(self, since: int, *, limit: int | None = None,
                   origins: Collection[str] | None = None) -> tuple[int, bytes]:
        """SSE frames of the events :meth:`events_since` would return, concatenated.

        Returns ``(last_id, frames)``: ``last_id`` is the id of the last event *scanned* (``since``
        when there is none), so a caller pages with ``since = last_id`` until ``last_id == since``.
        With ``limit``, a page scans the ids ``since + 1 … since + limit`` only (retained ids are
        contiguous), so a page is bounded work even for an origin with no events in a big log.
        Each frame equals ``protocol.sse.encode_event(event)`` byte for byte. One snapshot (SQLite: a
        read transaction; PostgreSQL: REPEATABLE READ), so the returned id never passes an event the
        page did not see.
        """
        since = operator.index(since)
        if limit is not None:
            limit = operator.index(limit)
            if limit <= 0:
                return since, b""
        mark = self.sql.mark
        where, params = visibility(mark, origins)
        with self.snapshot() as conn:
            # two subqueries: SQLite answers a lone MIN or MAX from the primary key's b-tree, but scans
            # the whole table for both in one SELECT
            first, top = conn.execute("SELECT (SELECT MIN(id) FROM events), (SELECT MAX(id) FROM events)").fetchone()
            if top is None or top <= since:
                return since, b""
            start = max(since, int(first) - 1)
            end = int(top) if limit is None else min(start + limit, int(top))
            rows = conn.execute(f"SELECT frame FROM events WHERE id > {mark} AND id <= {mark}{where} ORDER BY id",
                                [start, end, *params]).fetchall()
        return end, b"".join([r[0] for r in rows])  # bytes (SQLite) or a buffer (psycopg): join takes both

    def first_event_id(self) -> int:
        """Id of the oldest retained event; when none is retained, the id the next event gets."""
        with self.snapshot() as conn:
            row = conn.execute("SELECT MIN(id) FROM events").fetchone()
            if row[0] is not None:
                return int(row[0])
            return self._next_id(conn)

    def _prune_page(self) -> int:
        """Events deleted per transaction by :meth:`prune_events`."""
        return PRUNE_PAGE

    def _after_prune_page(self) -> None:
        """Between two pruned pages."""

    def _after_prune(self, deleted: int) -> None:
        """After pruning ``deleted`` events."""

    def prune_events(self, max_age_s: float | None = None, max_count: int | None = None) -> int:
        """Drop the oldest events: those older than ``max_age_s`` and all but the newest ``max_count``.

        Retention removes a prefix: age pruning stops at the first event young enough, so an event
        with an earlier clock reading behind it survives and ids stay contiguous. The edge is decided
        once (appends meanwhile stay); then pages of :meth:`_prune_page` events, one short
        transaction each, so appends from other threads and brokers go on in between. Returns how
        many events were deleted. Raises ValueError for a negative limit.
        """
        if max_age_s is not None and (not isinstance(max_age_s, int | float) or max_age_s < 0):
            raise ValueError("max_age_s must be a number >= 0")
        if max_count is not None:
            max_count = operator.index(max_count)
            if max_count < 0:
                raise ValueError("max_count must be >= 0")
        with self.snapshot() as conn:
            edge: int | None = None
            if max_age_s is not None:
                keep = conn.execute(self.sql("SELECT id FROM events WHERE ts >= ? ORDER BY id LIMIT 1"),
                                    (self.now() - max_age_s,)).fetchone()
                edge = self._next_id(conn) if keep is None else int(keep[0])
            if max_count is not None:
                if max_count == 0:
                    cut = self._next_id(conn)
                else:
                    row = conn.execute(self.sql("SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?"),
                                       (max_count - 1,)).fetchone()
                    cut = 0 if row is None else int(row[0])
                edge = cut if edge is None else max(edge, cut)
        if not edge:
            return 0
        deleted = 0
        page = self._prune_page()
        while True:
            with self.transaction() as conn:
                low = conn.execute("SELECT MIN(id) FROM events").fetchone()[0]
                if low is None or low >= edge:
                    break
                deleted += conn.execute(self.sql("DELETE FROM events WHERE id >= ? AND id < ?"),
                                        (low, min(edge, int(low) + page))).rowcount
            self._after_prune_page()
        if deleted:
            self._after_prune(deleted)
        return deleted


class EventsMixin(EventRows, Database):
    """The SQLite store's part of ``EventStore``: ids from ``AUTOINCREMENT``'s sequence (explicit ids
    still advance ``sqlite_sequence``: a pruned id never comes back), rows by ``executemany``, replay,
    and the freed pages given back after pruning."""

    def _take_ids(self, conn: Any, n: int) -> int:
        return self._next_id(conn)

    def _insert_events(self, conn: Any, rows: list[tuple[int, float, str, str | None, str | None, bytes]]) -> None:
        conn.executemany("INSERT INTO events (id, ts, type, origin, run_id, frame) VALUES (?,?,?,?,?,?)", rows)

    def last_event_id(self) -> int:
        """Id of the newest event ever appended (0 when none); survives pruning."""
        row = self.query("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
        return int(row[0][0]) if row else 0

    def _after_prune_page(self) -> None:
        time.sleep(0.001)  # threading locks are not fair: let a waiting append in first

    def _after_prune(self, deleted: int) -> None:
        self.vacuum_free_pages()  # the file shrinks

    @staticmethod
    def _next_id(conn: Any) -> int:
        row = conn.execute("SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), "
                           "COALESCE((SELECT MAX(id) FROM events), 0)) + 1").fetchone()
        return int(row[0])

    def vacuum_free_pages(self, pages_per_step: int = 2048) -> int:
        """Give free pages back to the file system in steps of ``pages_per_step`` (one short write
        each). A file without ``auto_vacuum`` (older than schema 5 and not yet converted) keeps them
        for reuse. Returns how many pages were freed."""
        freed = 0
        while True:
            with self._lock:
                conn = self._require()
                if self._depth or conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                    return freed
                before = conn.execute("PRAGMA freelist_count").fetchone()[0]
                if before == 0:
                    return freed
                try:
                    conn.execute(f"PRAGMA incremental_vacuum({int(pages_per_step)})").fetchall()
                except sqlite3.OperationalError:
                    return freed
                after = conn.execute("PRAGMA freelist_count").fetchone()[0]
            if after >= before:
                return freed
            freed += before - after
