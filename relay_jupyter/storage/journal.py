"""The runs journal (docs/storage.md, runs journal): runs, and an intent and an outcome record per tool call.

An intent is written before a tool executes and an outcome after. At broker start
:meth:`JournalMixin.mark_interrupted` turns every run without a terminal state into ``interrupted``;
:meth:`JournalMixin.calls_without_outcome` then lists the calls whose effect is unknown (answered
"outcome unknown — the action may have happened", never replayed). Behaviour matches
:class:`relay_jupyter.core.memory.MemoryRunJournal`.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from typing import Any

from ..protocol.names import TERMINAL_EVENTS
from ..core.memory import check_call_intent, check_dict, check_finish, check_run_start
from ._db import dumps
from .dialect import SqlStore

__all__ = ["INTERRUPTED", "RUNNING", "JournalMixin"]

RUNNING = "running"
INTERRUPTED = "interrupted"

_RUN_COLUMNS = "run_id, origin, conversation, state, started_at, finished_at, meta"
_CALL_COLUMNS = "run_id, call_id, tool, arguments, intent_at, outcome, outcome_at"
_TERMINAL_TYPES = tuple(sorted(TERMINAL_EVENTS))
_TERMINAL_ID = (f"SELECT id FROM events WHERE run_id = ? AND type IN ({','.join('?' * len(_TERMINAL_TYPES))}) "
                "ORDER BY id LIMIT 1")


def _run(row: tuple[Any, ...]) -> dict[str, Any]:
    run_id, origin, conversation, state, started_at, finished_at, meta = row
    return {"run_id": run_id, "origin": origin, "conversation": conversation, "state": state,
            "started_at": started_at, "finished_at": finished_at, "meta": json.loads(meta)}


def _call(row: tuple[Any, ...]) -> dict[str, Any]:
    run_id, call_id, tool, arguments, intent_at, outcome, outcome_at = row
    return {"run_id": run_id, "call_id": call_id, "tool": tool, "arguments": json.loads(arguments),
            "intent_at": intent_at, "outcome": None if outcome is None else json.loads(outcome),
            "outcome_at": outcome_at}


class JournalMixin(SqlStore):
    """``RunJournal`` over the ``runs`` and ``calls`` tables (both stores)."""

    def run_started(self, run_id: str, origin: str, conversation: str, meta: dict[str, Any]) -> None:
        """Record a new run in state ``running`` (replacing a run with the same id)."""
        check_run_start(run_id, origin, conversation, meta)
        with self.transaction() as conn:
            # delete + insert (SQLite's INSERT OR REPLACE does the same): a replaced run goes to the end of the order
            conn.execute(self.sql("DELETE FROM runs WHERE run_id = ?"), (run_id,))
            conn.execute(self.sql(f"INSERT INTO runs ({_RUN_COLUMNS}, owner) VALUES (?, ?, ?, ?, ?, NULL, ?, ?)"),
                         (run_id, origin, conversation, RUNNING, self.now(), dumps(meta), self.owner_id))

    def run_finished(self, run_id: str, state: str, meta: dict[str, Any] | None = None) -> None:
        """Mark a run terminal with ``state``; ``meta`` is merged into its metadata.

        Raises KeyError for an unknown run, ValueError for ``state == "running"``.
        """
        check_finish(state, meta)
        with self.transaction() as conn:
            self._end(conn, run_id, state, meta, once=False)

    def _end(self, conn: Any, run_id: str, state: str, meta: dict[str, Any] | None, *, once: bool) -> bool:
        """Set the run's terminal ``state`` and merge ``meta`` into its metadata; with ``once``, only
        if it is still unfinished (False: it had ended, nothing written). The run's row is read
        ``{for_update}``: two brokers never both end it. KeyError for an unknown run."""
        row = conn.execute(self.sql("SELECT meta, finished_at FROM runs WHERE run_id = ?{for_update}"),
                           (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"unknown run {run_id!r}")
        if once and row[1] is not None:
            return False
        merged = {**json.loads(row[0]), **(meta or {})}
        conn.execute(self.sql("UPDATE runs SET state = ?, finished_at = ?, meta = ? WHERE run_id = ?"),
                     (state, self.now(), dumps(merged), run_id))
        return True

    def call_intent(self, run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        """Record that ``call_id`` is about to execute. Written, and committed, before the tool runs."""
        check_call_intent(run_id, call_id, tool, arguments)
        with self.transaction() as conn:
            conn.execute(self.sql("DELETE FROM calls WHERE run_id = ? AND call_id = ?"), (run_id, call_id))
            conn.execute(self.sql(f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, NULL)"),
                         (run_id, call_id, tool, dumps(arguments), self.now()))

    def call_outcome(self, run_id: str, call_id: str, outcome: dict[str, Any]) -> None:
        """Record the outcome of a call whose intent was recorded. Raises KeyError when there is no intent."""
        check_dict("outcome", outcome)
        with self.transaction() as conn:
            cur = conn.execute(self.sql("UPDATE calls SET outcome = ?, outcome_at = ? WHERE run_id = ? AND call_id = ?"),
                               (dumps(outcome), self.now(), run_id, call_id))
            if cur.rowcount == 0:
                raise KeyError(f"no intent recorded for call {call_id!r} of run {run_id!r}")

    def unfinished_runs(self) -> list[str]:
        """Ids of runs without a terminal state, oldest first."""
        return [r[0] for r in self.query(self.sql("SELECT run_id FROM runs WHERE finished_at IS NULL ORDER BY {seq}"))]

    def calls_without_outcome(self, run_id: str) -> list[dict[str, Any]]:
        """Calls of ``run_id`` that have an intent and no outcome, in intent order."""
        rows = self.query(self.sql(f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? AND outcome IS NULL "
                                   "ORDER BY {seq}"), (run_id,))
        return [_call(r) for r in rows]

    def list_runs(self, *, origin: str | None = None, limit: int = 100,
                  origin_prefix: str | None = None) -> list[dict[str, Any]]:
        """Newest runs first (without their calls), optionally only those of ``origin`` and those whose origin
        starts with ``origin_prefix`` (``substr`` rather than ``LIKE``: no wildcard in a prefix to escape)."""
        limit = max(0, operator.index(limit))
        where: list[str] = []
        args: list[Any] = []
        if origin is not None:
            where.append("origin = ?")
            args.append(origin)
        if origin_prefix is not None:
            where.append("substr(origin, 1, ?) = ?")
            args += [len(origin_prefix), origin_prefix]
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self.query(self.sql(f"SELECT {_RUN_COLUMNS} FROM runs{clause} ORDER BY {{seq}} DESC LIMIT ?"),
                          (*args, limit))
        return [_run(r) for r in rows]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run with ``calls`` (intent order, each with its outcome or None), or None."""
        with self.snapshot() as conn:
            row = conn.execute(self.sql(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?"), (run_id,)).fetchone()
            if row is None:
                return None
            calls = conn.execute(self.sql(f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? ORDER BY {{seq}}"),
                                 (run_id,)).fetchall()
        run = _run(row)
        run["calls"] = [_call(c) for c in calls]
        return run

    def finish_run(self, run_id: str, state: str, meta: dict[str, Any] | None,
                   terminal: Sequence[tuple[str, dict[str, Any], str | None, str | None]]
                   ) -> tuple[list[Any], list[bytes]] | None:
        """The one place a run becomes terminal (runtime/manager.py and runtime/recovery.py use it):
        in one transaction, mark the run ``state`` *only if it is still unfinished* and append its
        ``terminal`` event(s). Returns the stored ``(events, frames)``, or None when the run had
        already ended (then nothing is written: there is never a second terminal event).

        Raises KeyError for an unknown run, StorageUnavailable when the store cannot be written.
        """
        check_finish(state, meta)
        with self.transaction() as conn:
            if not self._end(conn, run_id, state, meta, once=True):
                return None
            return self.append_events_framed(terminal)

    def terminal_event(self, run_id: str) -> Any:
        """The stored terminal event of ``run_id`` (None when it has none)."""
        rows = self.query(self.sql(_TERMINAL_ID), (run_id, *_TERMINAL_TYPES))
        if not rows:
            return None
        found = self.events_since(int(rows[0][0]) - 1, limit=1)
        return found[0] if found else None

    def runs_to_recover(self, live: set[str] | None = None) -> list[dict[str, Any]]:
        """Unfinished runs whose owner is dead (not in ``live``; default: :meth:`live_owners`), oldest first."""
        live = self.live_owners() if live is None else live
        rows = self.query(self.sql(f"SELECT {_RUN_COLUMNS}, owner FROM runs WHERE finished_at IS NULL ORDER BY {{seq}}"))
        return [{**_run(r[:-1]), "owner": r[-1]} for r in rows if r[-1] is None or r[-1] not in live]

    def running_elsewhere(self, conversation: str) -> bool:
        """True when another live broker has an unfinished run in ``conversation``."""
        rows = self.query(self.sql("SELECT owner FROM runs WHERE conversation = ? AND finished_at IS NULL"),
                          (conversation,))
        mine = self.owner_id
        others = {r[0] for r in rows if r[0] is not None and r[0] != mine}
        return bool(others & self.live_owners())

    def pending_permissions(self, *, run_id: str | None = None, live: set[str] | None = None
                            ) -> list[dict[str, Any]]:
        """Permission requests still waiting for an answer (of ``run_id``); with ``live`` (the live
        owners), only those of dead owners."""
        cols = ("request_id", "owner", "origin", "run_id", "event_id", "created_at")
        if run_id is None:
            rows = self.query(f"SELECT {', '.join(cols)} FROM pending_permissions ORDER BY event_id")
        else:
            rows = self.query(self.sql(f"SELECT {', '.join(cols)} FROM pending_permissions WHERE run_id = ? "
                                       "ORDER BY event_id"), (run_id,))
        out = [dict(zip(cols, r, strict=True)) for r in rows]
        if live is not None:
            out = [p for p in out if p["owner"] is None or p["owner"] not in live]
        return out

    def mark_interrupted(self) -> list[str]:
        """At broker start: every run without a terminal state becomes ``interrupted``. Returns their ids."""
        with self.transaction() as conn:
            ids = [r[0] for r in conn.execute(self.sql("SELECT run_id FROM runs WHERE finished_at IS NULL "
                                                       "ORDER BY {seq}{for_update}")).fetchall()]
            now = self.now()
            self.sql.executemany(conn, self.sql("UPDATE runs SET state = ?, finished_at = ? WHERE run_id = ?"),
                                 [(INTERRUPTED, now, run_id) for run_id in ids])
        return ids
