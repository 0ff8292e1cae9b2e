"""In-memory implementations of every port in :mod:`relay_jupyter.core.ports`.

Used by unit tests across the project and as the reference behaviour the durable
SQLite / JSON-lines stores in ``relay_jupyter.storage`` must match. Each class is
thread-safe (one ``threading.Lock``) because the broker calls ports from worker
threads as well as the event loop. Values handed out are immutable pydantic models
or fresh dicts, so a caller cannot reach into the store's state.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .types import AuditRecord, Event, Grant

__all__ = [
    "MemoryAuditSink",
    "MemoryEventStore",
    "MemoryGrantStore",
    "MemoryLedger",
    "MemoryRunJournal",
]


class MemoryGrantStore:
    """``GrantStore`` in a dict keyed by origin."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: dict[str, Grant] = {}

    def get_grant(self, origin: str) -> Grant | None:
        """The stored grant of ``origin`` (expired or not), or None."""
        with self._lock:
            return self._grants.get(origin)

    def put_grant(self, grant: Grant) -> None:
        """Insert or replace the grant of ``grant.origin``."""
        with self._lock:
            self._grants[grant.origin] = grant

    def delete_grant(self, origin: str) -> bool:
        """Remove the grant of ``origin``; True if there was one."""
        with self._lock:
            return self._grants.pop(origin, None) is not None

    def list_grants(self) -> list[Grant]:
        """Every stored grant, ordered by origin."""
        with self._lock:
            return [self._grants[k] for k in sorted(self._grants)]


class MemoryLedger:
    """``Ledger``: committed (tokens, cost_usd) per (origin, UTC day), and the holds (reservations) of
    requests in flight. A hold's check and insert happen under one lock, as the SQLite store does them
    in one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rows: dict[tuple[str, str], tuple[int, float]] = {}
        # hold id -> (origin, day, tokens, cost_usd, expires_at, charged by sweep_holds)
        self._holds: dict[str, tuple[str, str, int, float, float, bool]] = {}
        self._next_hold = 0

    def usage(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) committed so far for ``origin`` on ``day``."""
        with self._lock:
            return self._rows.get((origin, day), (0, 0.0))

    def add_usage(self, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        """Add to the committed usage. Negative amounts are refused: the ledger only grows."""
        if tokens < 0 or cost_usd < 0:
            raise ValueError("ledger usage cannot be negative")
        with self._lock:
            t, c = self._rows.get((origin, day), (0, 0.0))
            self._rows[(origin, day)] = (t + int(tokens), c + float(cost_usd))

    def held(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) held by live reservations of ``origin`` on ``day``."""
        with self._lock:
            hs = [h for h in self._holds.values() if h[0] == origin and h[1] == day and not h[5]]
            return sum(h[2] for h in hs), sum(h[3] for h in hs)

    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        """Charge expired holds, then call ``check(used_tokens, used_cost, held_tokens, held_cost)``
        (it raises to refuse) and record a hold of ``tokens``/``cost_usd``; all under one lock.
        Returns the hold's id."""
        with self._lock:
            self.sweep_holds(now)
            used_t, used_c = self.usage(origin, day)
            held_t, held_c = self.held(origin, day)
            check(used_t, used_c, held_t, held_c)
            self._next_hold += 1
            hold_id = f"h{self._next_hold}"
            self._holds[hold_id] = (origin, day, int(tokens), float(cost_usd), float(expires_at), False)
            return hold_id

    def finish_hold(self, hold_id: str, tokens: int | None, cost_usd: float | None) -> bool:
        """Commit ``tokens``/``cost_usd`` (None: nothing, the request was never sent) and drop the hold.
        A hold already charged by :meth:`sweep_holds` (it expired) adds only what exceeds its amount.
        The usage is committed before the hold goes, so a failing commit keeps the hold. True when the
        hold was live."""
        with self._lock:
            h = self._holds.get(hold_id)
            if h is None:
                return False
            if tokens is not None and cost_usd is not None:
                if h[5]:
                    self.add_usage(h[0], h[1], max(0, tokens - h[2]), max(0.0, cost_usd - h[3]))
                else:
                    self.add_usage(h[0], h[1], tokens, cost_usd)
            del self._holds[hold_id]
            return not h[5]

    def sweep_holds(self, now: float) -> int:
        """Charge every live hold whose ``expires_at`` has passed at its full amount (its broker died
        or lost it: the request may have been sent); charged holds are forgotten a day after expiry.
        Returns how many were charged."""
        with self._lock:
            n = 0
            for k, h in list(self._holds.items()):
                if h[5]:
                    if h[4] + 86400 <= now:
                        del self._holds[k]
                elif h[4] <= now:
                    self.add_usage(h[0], h[1], h[2], h[3])
                    self._holds[k] = (*h[:5], True)
                    n += 1
            return n


class MemoryAuditSink:
    """``AuditSink`` in a list; assigns sequence numbers from 1."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[AuditRecord] = []

    def append(self, record: AuditRecord) -> AuditRecord:
        """Append ``record`` with the next sequence number and return the stored copy."""
        with self._lock:
            stored = record.model_copy(update={"seq": len(self._records) + 1})
            self._records.append(stored)
            return stored

    def tail(self, n: int = 100, *, origin: str | None = None) -> list[AuditRecord]:
        """The last ``n`` records (oldest first), optionally only those of ``origin``."""
        if n <= 0:
            return []
        with self._lock:
            rows = self._records if origin is None else [r for r in self._records if r.origin == origin]
            return list(rows[-n:])

    @property
    def records(self) -> list[AuditRecord]:
        """Every record so far (a copy of the list)."""
        with self._lock:
            return list(self._records)


class MemoryEventStore:
    """``EventStore``: ids from 1, strictly increasing; optional retention by count."""

    def __init__(self, *, max_events: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._next_id = 1
        self._max = max_events
        self._clock = clock

    def _append_locked(self, type: str, data: dict[str, Any], origin: str | None, run_id: str | None) -> Event:
        event = Event(id=self._next_id, ts=self._clock(), type=type, origin=origin, run_id=run_id,
                      data=copy.deepcopy(data))
        self._next_id += 1
        self._events.append(event)
        return event

    def _trim_locked(self) -> None:
        if self._max is not None and len(self._events) > self._max:
            del self._events[: len(self._events) - self._max]

    def append_event(self, type: str, data: dict[str, Any], *, origin: str | None = None,
                     run_id: str | None = None) -> Event:
        """Append one event and return it with its id."""
        with self._lock:
            event = self._append_locked(type, data, origin, run_id)
            self._trim_locked()
            return event

    def append_events(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]) -> list[Event]:
        """Append (type, data, origin, run_id) tuples atomically (all or none)."""
        with self._lock:
            out = [self._append_locked(t, d, o, r) for t, d, o, r in items]
            self._trim_locked()
            return out

    def events_since(self, since: int, *, limit: int | None = None) -> list[Event]:
        """Events with id > ``since``, oldest first; the first ``limit`` of them when given."""
        with self._lock:
            # ids are dense and increasing, so a binary search would do; a scan keeps the reference simple.
            rows = [e for e in self._events if e.id > since]
        return rows if limit is None else rows[:limit]

    def last_event_id(self) -> int:
        """Id of the newest event ever appended (0 when none)."""
        with self._lock:
            return self._next_id - 1


class MemoryRunJournal:
    """``RunJournal``: intent and outcome records per run."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, Any]] = {}
        self._calls: dict[str, dict[str, dict[str, Any]]] = {}
        self._clock = clock

    def run_started(self, run_id: str, origin: str, conversation: str, meta: dict[str, Any]) -> None:
        """Record a new run in state ``running``."""
        with self._lock:
            self._runs[run_id] = {
                "run_id": run_id, "origin": origin, "conversation": conversation,
                "state": "running", "started_at": self._clock(), "finished_at": None,
                "meta": copy.deepcopy(meta),
            }
            self._calls.setdefault(run_id, {})

    def run_finished(self, run_id: str, state: str, meta: dict[str, Any] | None = None) -> None:
        """Mark a run terminal with ``state``; ``meta`` is merged into its metadata."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                raise KeyError(f"unknown run {run_id!r}")
            run["state"] = state
            run["finished_at"] = self._clock()
            if meta:
                run["meta"].update(copy.deepcopy(meta))

    def call_intent(self, run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        """Record that ``call_id`` is about to execute (written before the tool runs)."""
        with self._lock:
            self._calls.setdefault(run_id, {})[call_id] = {
                "run_id": run_id, "call_id": call_id, "tool": tool,
                "arguments": copy.deepcopy(arguments), "intent_at": self._clock(), "outcome": None,
            }

    def call_outcome(self, run_id: str, call_id: str, outcome: dict[str, Any]) -> None:
        """Record the outcome of a call whose intent was recorded."""
        with self._lock:
            call = self._calls.get(run_id, {}).get(call_id)
            if call is None:
                raise KeyError(f"no intent recorded for call {call_id!r} of run {run_id!r}")
            call["outcome"] = copy.deepcopy(outcome)

    def unfinished_runs(self) -> list[str]:
        """Ids of runs without a terminal state."""
        with self._lock:
            return [r for r, row in self._runs.items() if row["finished_at"] is None]

    def calls_without_outcome(self, run_id: str) -> list[dict[str, Any]]:
        """Calls of ``run_id`` that have an intent and no outcome."""
        with self._lock:
            return [copy.deepcopy(c) for c in self._calls.get(run_id, {}).values() if c["outcome"] is None]

    def list_runs(self, *, origin: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Newest runs first, optionally filtered by origin."""
        with self._lock:
            rows = [copy.deepcopy(r) for r in self._runs.values() if origin is None or r["origin"] == origin]
        # dicts keep insertion order, so reversing gives newest first even when clock values tie
        rows.reverse()
        return rows[: max(0, limit)]
