"""The in-memory implementation of the ports in :mod:`relay_jupyter.core.ports`.

:class:`MemoryStore` is the one in-memory :class:`~relay_jupyter.core.ports.Store` (brokers opened
with ``in_memory``, unit tests, benchmarks) and the reference behaviour every durable store must
match: ``relay_jupyter.testing.store_contract`` runs the same contract against it and against
SQLite. The names ``MemoryGrantStore``, ``MemoryLedger``, ``MemoryEventStore``,
``MemoryRunJournal`` (and ``runtime.conversations.MemoryConversations``) are the same class, kept
for callers that only need one port.

Thread-safe: one re-entrant lock. Transactions (:meth:`MemoryStore.transaction`) keep an undo log,
so a failure inside one rolls every write of it back, as SQLite does. Values handed out are
immutable pydantic models or fresh copies.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import operator
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import Refusal
from .ports import Checkpoint, EventItem
from .telemetry import TelemetryRow, check_telemetry_query, newest_first_limit
from .types import AuditRecord, Event, Grant, ToolClass

__all__ = [
    "MemoryAuditSink",
    "MemoryCheckpoints",
    "MemoryEventStore",
    "MemoryGrantStore",
    "MemoryLedger",
    "MemoryRunJournal",
    "MemoryStore",
    "charge_totals",
    "append_start",
    "check_amount",
    "check_call_intent",
    "check_conversation",
    "check_dict",
    "check_event_items",
    "check_finish",
    "check_run_start",
    "check_team_limits",
    "check_text",
    "LEGACY_HOLD_SKEW",
    "held_by_dead",
    "hold_owner",
    "new_hold_id",
    "settle_charge",
    "sse_frame",
]

# The event types the store itself follows (protocol.names.EventType; core sits below protocol, so
# the strings are repeated here; tests/storage/test_store_contract.py checks they match).
PERMISSION_REQUEST = "permission.request"
PERMISSION_ENDS = frozenset({"permission.resolved", "permission_timeout"})
TERMINAL_TYPES = frozenset({"run.done", "run.cancelled", "run.error", "run.budget_exhausted", "run.interrupted"})
_MISSING = object()
_DAY = 86400.0


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


def check_tool_key(server: Any, tool: Any, *, builtin_ok: bool) -> None:
    """Check a ``(server, tool)`` key of saved trust or a pin (``ToolSpec.key``): two strings without NUL,
    ``tool`` not empty, ``server`` not empty unless ``builtin_ok`` (``""``: relay's own tool)."""
    if not isinstance(server, str):
        raise TypeError(f"server must be a string, got {type(server).__name__}")
    if server or not builtin_ok:
        check_text("server", server)
    check_text("tool", tool)


def check_amount(name: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is a number, ``ValueError`` unless it is finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


# -- budget-hold arithmetic: one definition for every store (this one, storage/records.py, storage/postgres.py)

def new_hold_id(owner: str | None = None, prefix: str = "") -> str:
    """A new hold id: ``prefix`` (the PostgreSQL store's ``t`` for a hold in the shared team schema),
    random, then ``@`` and the owner id of the broker taking it when it has one, so the holds of a
    broker found dead can be charged at once (``charge_dead_holds``)."""
    return prefix + secrets.token_hex(12) + ("@" + owner if owner else "")


def hold_owner(hold_id: str) -> str | None:
    """The owner a hold id carries: everything after its first ``@`` (None: a hold taken before holds
    carried owners, or by a broker without a lease)."""
    _, sep, owner = hold_id.partition("@")
    return owner if sep and owner else None


LEGACY_HOLD_SKEW = 60.0
"""Seconds of clock difference between brokers allowed when judging a hold without an owner: a live
lease started up to this long after such a hold was taken may still be the broker that took it."""


def held_by_dead(hold_id: str, live: Mapping[str, float], created_at: float) -> bool:
    """Whether the live hold ``hold_id`` (taken at ``created_at``) is to be charged in full now.
    ``live``: the live brokers' owner keys, each with the time its lease started.

    A hold that carries an owner (``@owner``) is charged when that owner is not in ``live``. One
    without (taken before hold ids carried owners, by an older relay-jupyter) is charged when no live
    broker could have taken it: every live lease started after it (more than :data:`LEGACY_HOLD_SKEW`
    later) — its broker is gone, so it no longer waits for its expiry (15 minutes or more)."""
    owner = hold_owner(hold_id)
    if owner is not None:
        return owner not in live
    return not any(float(started) <= float(created_at) + LEGACY_HOLD_SKEW for started in live.values())


def check_team_limits(team: str, limits: Mapping[str, Any]) -> dict[str, Any]:
    """``limits`` as the stores keep a team's (``TeamBudget.model_dump()``), checked: a valid team name
    and only the four limits, each None or a finite number >= 0 (ValueError/TypeError otherwise)."""
    from .teams import Team, TeamBudget

    if not isinstance(team, str) or not isinstance(limits, Mapping):
        raise TypeError("team limits are a team name and a dict of its limits")
    Team(name=team)  # ValidationError (a ValueError) for a name no team can have
    return TeamBudget.model_validate(dict(limits)).model_dump()


def settle_charge(tokens: int, cost_usd: float, held_tokens: int, held_cost: float, charged: bool
                  ) -> tuple[int, float]:
    """What settling a hold at ``tokens``/``cost_usd`` adds to the ledger: all of it, or, when the hold
    was charged in full already (it expired, or its broker was found dead), only what exceeds the
    held amount (never less than nothing)."""
    if charged:
        return max(0, int(tokens) - int(held_tokens)), max(0.0, float(cost_usd) - float(held_cost))
    return int(tokens), float(cost_usd)


def charge_totals(holds: Iterable[tuple[str, str, int, float]]) -> list[tuple[str, str, int, float]]:
    """``(origin, day, tokens, cost_usd)`` of holds charged in full, summed per ledger row and sorted by
    ``(origin, day)``: one addition per row, in one order (two PostgreSQL brokers charging at once lock
    the rows in that order and never deadlock)."""
    totals: dict[tuple[str, str], tuple[int, float]] = {}
    for origin, day, tokens, cost in holds:
        t, c = totals.get((origin, day), (0, 0.0))
        totals[(origin, day)] = (t + int(tokens), c + float(cost))
    return [(origin, day, t, c) for (origin, day), (t, c) in sorted(totals.items())]


def check_dict(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {value.__class__.__name__}")


def check_event(type: Any, data: Any, origin: Any, run_id: Any) -> None:
    """The checks every store applies to an event to append."""
    check_text("event type", type)
    if "\n" in type or "\r" in type:
        raise ValueError("event type must be one line (it becomes an SSE 'event:' field)")
    check_dict("event data", data)
    check_text("event origin", origin, optional=True)
    check_text("event run_id", run_id, optional=True)


def check_event_items(items: Sequence[Any]) -> list[Any]:
    """The events of one append as a list, each a ``(type, data, origin, run_id)`` tuple that passes
    :func:`check_event` (TypeError / ValueError otherwise): the checks of every store's append."""
    items = list(items)
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 4:
            raise TypeError("each event must be a (type, data, origin, run_id) tuple")
        check_event(*item)
    return items


def check_run_start(run_id: Any, origin: Any, conversation: Any, meta: Any) -> None:
    """The arguments of ``run_started``."""
    check_text("run_id", run_id)
    check_text("origin", origin)
    check_text("conversation", conversation)
    check_dict("meta", meta)


def check_call_intent(run_id: Any, call_id: Any, tool: Any, arguments: Any) -> None:
    """The arguments of ``call_intent``."""
    check_text("run_id", run_id)
    check_text("call_id", call_id)
    check_text("tool", tool)
    check_dict("arguments", arguments)


def check_finish(state: Any, meta: Any) -> None:
    """The arguments of a run's end (``run_finished``, ``finish_run``): a terminal state and a dict meta."""
    check_text("state", state)
    if state == "running":
        raise ValueError("a finished run needs a terminal state, not 'running'")
    if meta is not None:
        check_dict("meta", meta)


def append_start(conv_id: str, count: int, start: int, *, replace: bool) -> int:
    """Where a conversation write of messages from ``start`` begins, given the ``count`` stored: 0 when it
    replaces the whole history; ``start`` otherwise (the messages from there on are rewritten). ``ValueError``
    when ``start`` would leave a gap after the stored messages."""
    if replace:
        return 0
    if start > count:
        raise ValueError(f"conversation {conv_id!r} has {count} messages; cannot append at {start}")
    return start


def check_conversation(conv_id: Any, origin: Any, name: Any, messages: Any, meta: Any) -> None:
    """The arguments of a conversation write (``save_conversation``, ``append_messages``)."""
    check_text("conv_id", conv_id)
    check_text("origin", origin)
    if not isinstance(name, str):
        raise TypeError("name must be a string")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts")
    check_dict("meta", meta)


def sse_frame(event: Event) -> bytes:
    """``protocol.sse.encode_event(event)``, byte for byte (core cannot import protocol; the contract
    suite checks both agree)."""
    payload = json.dumps(event.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
    return f"id: {event.id}\nevent: {event.type}\ndata: {payload}\n\n".encode()


def _json_copy(value: Any) -> Any:
    """What a JSON round trip gives (the durable stores keep JSON): odd values become strings."""
    return json.loads(json.dumps(value, default=str))


def _visible(event: Event, origins: Collection[str] | None) -> bool:
    return origins is None or event.origin is None or event.origin in origins


class MemoryStore:
    """Every port of :mod:`relay_jupyter.core.ports` in memory (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.time, *, max_events: int | None = None) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._undo: list[Callable[[], None]] | None = None
        self._closed = False
        self.storage_problem: Refusal | None = None
        self.owner_id: str | None = None
        self.lease_ttl: float = 30.0
        self._max_events = max_events
        self._grants: dict[str, Grant] = {}
        self._ledger: dict[tuple[str, str], tuple[int, float]] = {}
        self._holds: dict[str, tuple[str, str, int, float, float, bool, float]] = {}
        """hold id -> (origin, day, tokens, cost_usd, expires_at, charged)"""
        self._events: list[tuple[Event, bytes]] = []
        self._seq = 0
        """The newest event id ever handed out."""
        self._runs: dict[str, dict[str, Any]] = {}
        self._calls: dict[str, dict[str, dict[str, Any]]] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        self._conversations: dict[str, dict[str, Any]] = {}
        self._order = itertools.count(1)
        """Creation order of conversations: ties of ``updated_at`` list the newest created first."""
        self._trust: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(origin, server, tool) -> row: three separate values, never a joined name."""
        self._pins: dict[tuple[str, str], dict[str, Any]] = {}
        self._leases: dict[str, dict[str, Any]] = {}
        self._team_limits: dict[str, dict[str, Any]] = {}
        self._checkpoints = MemoryCheckpoints(self)
        self._telemetry: list[TelemetryRow] = []
        self._telemetry_seq = 0

    # -- transactions (an undo log) -----------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[object]:
        """Writes inside commit together or are undone together; nested, a savepoint."""
        with self._lock:
            self._require()
            outer = self._undo is None
            if outer:
                self._undo = []
            undo = self._undo
            assert undo is not None
            mark = len(undo)
            try:
                yield self
            except BaseException:
                while len(undo) > mark:
                    undo.pop()()
                raise
            finally:
                if outer:
                    self._undo = None

    def _log(self, step: Callable[[], None]) -> None:
        if self._undo is not None:
            self._undo.append(step)

    def _put(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        old = table.get(key, _MISSING)
        table[key] = value
        self._log(lambda: table.pop(key, None) if old is _MISSING else table.__setitem__(key, old))

    def _drop(self, table: dict[Any, Any], key: Any) -> bool:
        old = table.pop(key, _MISSING)
        if old is _MISSING:
            return False
        self._log(lambda: table.__setitem__(key, old))
        return True

    def _require(self) -> None:
        if self._closed:
            from .errors import RelayError

            raise RelayError("the relay store is closed")

    def now(self) -> float:
        return self._clock()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def probe_write(self) -> None:
        """Memory always takes a write: clears :attr:`storage_problem`."""
        self.storage_problem = None

    def check_space(self) -> None:
        """Memory has no file system to fill."""

    @property
    def checkpoints(self) -> MemoryCheckpoints:
        return self._checkpoints

    # -- grants ---------------------------------------------------------------------------------------

    def get_grant(self, origin: str) -> Grant | None:
        with self._lock:
            return self._grants.get(origin)

    def put_grant(self, grant: Grant) -> None:
        if not isinstance(grant, Grant):
            raise TypeError(f"put_grant needs a Grant, got {grant.__class__.__name__}")
        with self.transaction():
            self._put(self._grants, grant.origin, grant)

    def delete_grant(self, origin: str) -> bool:
        with self.transaction():
            return self._drop(self._grants, origin)

    def list_grants(self) -> list[Grant]:
        with self._lock:
            return [self._grants[k] for k in sorted(self._grants)]

    # -- ledger and holds -----------------------------------------------------------------------------

    def usage(self, origin: str, day: str) -> tuple[int, float]:
        with self._lock:
            return self._ledger.get((origin, day), (0, 0.0))

    def _add(self, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        t, c = self._ledger.get((origin, day), (0, 0.0))
        self._put(self._ledger, (origin, day), (t + int(tokens), c + float(cost_usd)))

    def add_usage(self, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        check_text("origin", origin)
        check_text("day", day)
        check_amount("tokens", tokens)
        check_amount("cost_usd", cost_usd)
        with self.transaction():
            self._add(origin, day, tokens, cost_usd)

    def held(self, origin: str, day: str) -> tuple[int, float]:
        with self._lock:
            hs = [h for h in self._holds.values() if h[0] == origin and h[1] == day and not h[5]]
            return sum(h[2] for h in hs), float(sum(h[3] for h in hs))

    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        check_text("origin", origin)
        check_text("day", day)
        check_amount("tokens", tokens)
        check_amount("cost_usd", cost_usd)
        with self.transaction():
            self._sweep(now)
            used_t, used_c = self.usage(origin, day)
            held_t, held_c = self.held(origin, day)
            check(used_t, used_c, held_t, held_c)
            hold_id = new_hold_id(self.owner_id)
            self._put(self._holds, hold_id, (origin, day, int(tokens), float(cost_usd), float(expires_at), False,
                                            float(now)))
            return hold_id

    def finish_hold(self, hold_id: str, tokens: int | None, cost_usd: float | None) -> bool:
        if tokens is not None:
            check_amount("tokens", tokens)
            check_amount("cost_usd", cost_usd)
        with self.transaction():
            h = self._holds.get(hold_id)
            if h is None:
                return False
            if tokens is not None and cost_usd is not None:
                # through add_usage (it may fail: the hold is then kept, as the usage is committed first)
                self.add_usage(h[0], h[1], *settle_charge(tokens, cost_usd, h[2], h[3], h[5]))
            self._drop(self._holds, hold_id)
            return not h[5]

    def _sweep(self, now: float) -> int:
        for k, h in list(self._holds.items()):
            if h[5] and h[4] + _DAY <= now:
                self._drop(self._holds, k)
        return self._charge([k for k, h in self._holds.items() if not h[5] and h[4] <= now])

    def _charge(self, hold_ids: list[str]) -> int:
        """Charge the live holds ``hold_ids`` in full and mark them charged."""
        for origin, day, tokens, cost in charge_totals(self._holds[k][:4] for k in hold_ids):
            self.add_usage(origin, day, tokens, cost)
        for k in hold_ids:
            h = self._holds[k]
            self._put(self._holds, k, (*h[:5], True, h[6]))
        return len(hold_ids)

    def sweep_holds(self, now: float) -> int:
        with self.transaction():
            return self._sweep(now)

    def charge_dead_holds(self) -> int:
        with self.transaction():
            live = self.live_lease_starts()
            return self._charge([k for k, h in self._holds.items() if not h[5] and held_by_dead(k, live, h[6])])

    # -- events ---------------------------------------------------------------------------------------

    def append_event(self, type: str, data: dict[str, Any], *, origin: str | None = None,
                     run_id: str | None = None) -> Event:
        return self.append_events([(type, data, origin, run_id)])[0]

    def append_events(self, items: Sequence[EventItem]) -> list[Event]:
        return self.append_events_framed(items)[0]

    def append_events_framed(self, items: Sequence[EventItem]) -> tuple[list[Event], list[bytes]]:
        items = check_event_items(items)
        if not items:
            return [], []
        with self.transaction():
            ts = float(self.now())
            first, seq0, count0 = self._seq + 1, self._seq, len(self._events)
            out: list[tuple[Event, bytes]] = []
            for n, (t, d, o, r) in enumerate(items):
                event = Event(id=first + n, ts=ts, type=t, origin=o, run_id=r, data=_json_copy(d))
                out.append((event, sse_frame(event)))
            self._events.extend(out)
            self._seq = first + len(items) - 1

            def undo() -> None:
                del self._events[count0:]
                self._seq = seq0

            self._log(undo)
            for n, (t, d, o, r) in enumerate(items):
                request_id = d.get("request_id")
                if not isinstance(request_id, str):
                    continue
                if t == PERMISSION_REQUEST:
                    self._put(self._pending, request_id, {"request_id": request_id, "owner": self.owner_id,
                                                          "origin": o, "run_id": r, "event_id": first + n,
                                                          "created_at": ts})
                elif t in PERMISSION_ENDS:
                    self._drop(self._pending, request_id)
        if self._max_events is not None and self._undo is None:
            self.prune_events(max_count=self._max_events)
        return [e for e, _ in out], [f for _, f in out]

    def _since(self, since: int, limit: int | None) -> list[tuple[Event, bytes]]:
        """Retained events with id > ``since``, at most ``limit`` of them (ids are contiguous)."""
        since = operator.index(since)
        if limit is not None and operator.index(limit) <= 0:
            return []
        if not self._events:
            return []
        start = max(0, since + 1 - self._events[0][0].id)
        end = None if limit is None else start + int(limit)
        return self._events[start:end]

    def events_since(self, since: int, *, limit: int | None = None,
                     origins: Collection[str] | None = None) -> list[Event]:
        with self._lock:
            if origins is None:
                return [e for e, _ in self._since(since, limit)]
            rows = [e for e, _ in self._since(since, None) if _visible(e, origins)]
        return rows if limit is None else rows[: max(0, limit)]

    def replay_sse(self, since: int, *, limit: int | None = None,
                   origins: Collection[str] | None = None) -> tuple[int, bytes]:
        with self._lock:
            rows = self._since(since, limit)
        if not rows:
            return operator.index(since), b""
        return rows[-1][0].id, b"".join(f for e, f in rows if _visible(e, origins))

    def last_event_id(self) -> int:
        with self._lock:
            return self._seq

    def first_event_id(self) -> int:
        with self._lock:
            return self._events[0][0].id if self._events else self._seq + 1

    def prune_events(self, max_age_s: float | None = None, max_count: int | None = None) -> int:
        if max_age_s is not None and (not isinstance(max_age_s, int | float) or max_age_s < 0):
            raise ValueError("max_age_s must be a number >= 0")
        if max_count is not None:
            max_count = operator.index(max_count)
            if max_count < 0:
                raise ValueError("max_count must be >= 0")
        with self.transaction():
            cut = 0
            if max_age_s is not None:
                cutoff = self.now() - max_age_s
                while cut < len(self._events) and self._events[cut][0].ts < cutoff:
                    cut += 1
            if max_count is not None:
                cut = max(cut, len(self._events) - max_count)
            if cut <= 0:
                return 0
            removed = self._events[:cut]
            del self._events[:cut]
            self._log(lambda: self._events.__setitem__(slice(0, 0), removed))
            return cut

    # -- runs journal ---------------------------------------------------------------------------------

    def run_started(self, run_id: str, origin: str, conversation: str, meta: dict[str, Any]) -> None:
        check_run_start(run_id, origin, conversation, meta)
        with self.transaction():
            self._drop(self._runs, run_id)  # a replaced run moves to the end (newest), as INSERT OR REPLACE
            self._put(self._runs, run_id, {
                "run_id": run_id, "origin": origin, "conversation": conversation, "state": "running",
                "started_at": self.now(), "finished_at": None, "meta": _json_copy(meta), "owner": self.owner_id})
            if run_id not in self._calls:
                self._put(self._calls, run_id, {})

    def _end(self, run_id: str, state: str, meta: dict[str, Any] | None) -> dict[str, Any]:
        run = self._runs.get(run_id)
        if run is None:
            raise KeyError(f"unknown run {run_id!r}")
        ended = {**run, "state": state, "finished_at": self.now(), "meta": {**run["meta"], **_json_copy(meta or {})}}
        self._put(self._runs, run_id, ended)
        return run

    def run_finished(self, run_id: str, state: str, meta: dict[str, Any] | None = None) -> None:
        check_finish(state, meta)
        with self.transaction():
            self._end(run_id, state, meta)

    def finish_run(self, run_id: str, state: str, meta: dict[str, Any] | None,
                   terminal: Sequence[EventItem]) -> tuple[list[Event], list[bytes]] | None:
        check_finish(state, meta)
        with self.transaction():
            run = self._runs.get(run_id)
            if run is None:
                raise KeyError(f"unknown run {run_id!r}")
            if run["finished_at"] is not None:
                return None
            self._end(run_id, state, meta)
            return self.append_events_framed(terminal)

    def terminal_event(self, run_id: str) -> Event | None:
        with self._lock:
            for event, _ in self._events:
                if event.run_id == run_id and event.type in TERMINAL_TYPES:
                    return event
        return None

    def _calls_of(self, run_id: str) -> dict[str, dict[str, Any]]:
        calls = self._calls.get(run_id)
        if calls is None:
            calls = {}
            self._put(self._calls, run_id, calls)
        return calls

    def call_intent(self, run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        check_call_intent(run_id, call_id, tool, arguments)
        with self.transaction():
            calls = self._calls_of(run_id)
            self._drop(calls, call_id)
            self._put(calls, call_id, {"run_id": run_id, "call_id": call_id, "tool": tool,
                                       "arguments": _json_copy(arguments), "intent_at": self.now(),
                                       "outcome": None, "outcome_at": None})

    def call_outcome(self, run_id: str, call_id: str, outcome: dict[str, Any]) -> None:
        check_dict("outcome", outcome)
        with self.transaction():
            calls = self._calls.get(run_id, {})
            call = calls.get(call_id)
            if call is None:
                raise KeyError(f"no intent recorded for call {call_id!r} of run {run_id!r}")
            self._put(calls, call_id, {**call, "outcome": _json_copy(outcome), "outcome_at": self.now()})

    def unfinished_runs(self) -> list[str]:
        with self._lock:
            return [r for r, row in self._runs.items() if row["finished_at"] is None]

    def calls_without_outcome(self, run_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(c) for c in self._calls.get(run_id, {}).values() if c["outcome"] is None]

    @staticmethod
    def _public_run(row: dict[str, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in row.items() if k != "owner"}

    def list_runs(self, *, origin: str | None = None, limit: int = 100,
                  origin_prefix: str | None = None) -> list[dict[str, Any]]:
        limit = max(0, operator.index(limit))
        with self._lock:
            rows = [self._public_run(r) for r in reversed(self._runs.values())
                    if (origin is None or r["origin"] == origin)
                    and (origin_prefix is None or r["origin"].startswith(origin_prefix))]
        return rows[:limit]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._runs.get(run_id)
            if row is None:
                return None
            run = self._public_run(row)
            run["calls"] = [copy.deepcopy(c) for c in self._calls.get(run_id, {}).values()]
            return run

    def runs_to_recover(self, live: set[str] | None = None) -> list[dict[str, Any]]:
        live = self.live_owners() if live is None else live
        with self._lock:
            return [{**self._public_run(r), "owner": r["owner"]} for r in self._runs.values()
                    if r["finished_at"] is None and (r["owner"] is None or r["owner"] not in live)]

    def running_elsewhere(self, conversation: str) -> bool:
        with self._lock:
            others = {r["owner"] for r in self._runs.values() if r["conversation"] == conversation
                      and r["finished_at"] is None and r["owner"] is not None and r["owner"] != self.owner_id}
        return bool(others & self.live_owners())

    def pending_permissions(self, *, run_id: str | None = None, live: set[str] | None = None
                            ) -> list[dict[str, Any]]:
        with self._lock:
            out = sorted((dict(p) for p in self._pending.values() if run_id is None or p["run_id"] == run_id),
                         key=lambda p: p["event_id"])
        if live is not None:
            out = [p for p in out if p["owner"] is None or p["owner"] not in live]
        return out

    def mark_interrupted(self) -> list[str]:
        with self.transaction():
            ids = self.unfinished_runs()
            for run_id in ids:
                self._end(run_id, "interrupted", None)
            return ids

    # -- conversations (append-only: messages before ``start`` are never rewritten) ---------------------

    def load_conversation(self, conv_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conversations.get(conv_id)
            if row is None:
                return None
            return {"conv_id": row["conv_id"], "origin": row["origin"], "name": row["name"],
                    "messages": copy.deepcopy(row["messages"]), "meta": copy.deepcopy(row["meta"]),
                    "created_at": row["created_at"], "updated_at": row["updated_at"]}

    def conversation_origin(self, conv_id: str) -> str | None:
        with self._lock:
            row = self._conversations.get(conv_id)
            return None if row is None else row["origin"]

    def save_conversation(self, conv_id: str, origin: str, name: str, messages: list[dict[str, Any]],
                          meta: dict[str, Any]) -> None:
        check_conversation(conv_id, origin, name, messages, meta)
        self._write_conversation(conv_id, origin, name, 0, messages, meta, replace=True)

    def append_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        check_conversation(conv_id, origin, name, messages, meta)
        start = operator.index(start)
        if start < 0:
            raise ValueError("start must be >= 0")
        self._write_conversation(conv_id, origin, name, start, messages, meta, replace=False)

    def _write_conversation(self, conv_id: str, origin: str, name: str, start: int,
                            messages: list[dict[str, Any]], meta: dict[str, Any], *, replace: bool) -> None:
        fresh = [_json_copy(m) for m in messages]
        with self.transaction():
            old = self._conversations.get(conv_id)
            now = self.now()
            stored = [] if old is None else old["messages"]
            kept = stored[:append_start(conv_id, len(stored), start, replace=replace)]
            self._put(self._conversations, conv_id, {
                "conv_id": conv_id, "origin": origin, "name": name, "messages": kept + fresh,
                "meta": _json_copy(meta), "created_at": now if old is None else old["created_at"],
                "updated_at": now, "_order": next(self._order) if old is None else old["_order"]})

    def delete_conversation(self, conv_id: str) -> bool:
        with self.transaction():
            return self._drop(self._conversations, conv_id)

    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = [r for r in self._conversations.values() if origin is None or r["origin"] == origin]
            rows.sort(key=lambda r: (r["updated_at"], r["_order"]), reverse=True)
            return [{"conv_id": r["conv_id"], "origin": r["origin"], "name": r["name"],
                     "message_count": len(r["messages"]), "meta": copy.deepcopy(r["meta"]),
                     "created_at": r["created_at"], "updated_at": r["updated_at"]} for r in rows]

    # -- trust and pins -------------------------------------------------------------------------------

    def add_trust(self, origin: str, server: str, tool: str, digest: str) -> None:
        check_text("origin", origin)
        check_tool_key(server, tool, builtin_ok=True)
        check_text("digest", digest)
        with self.transaction():
            self._put(self._trust, (origin, server, tool), {"origin": origin, "server": server, "tool": tool,
                                                            "digest": digest, "created_at": self.now()})

    def has_trust(self, origin: str, server: str, tool: str, digest: str) -> bool:
        with self._lock:
            row = self._trust.get((origin, server, tool))
            return row is not None and row["digest"] == digest

    def list_trust(self, origin: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for k, r in sorted(self._trust.items()) if origin is None or k[0] == origin]

    def revoke_trust(self, origin: str, *, server: str | None = None, tool: str | None = None) -> int:
        if tool is not None and server is None:
            raise ValueError("revoke_trust: a tool is named by (server, tool); pass server ('' for relay's own)")
        with self.transaction():
            keys = [k for k in self._trust if k[0] == origin and (server is None or k[1] == server)
                    and (tool is None or k[2] == tool)]
            for k in keys:
                self._drop(self._trust, k)
            return len(keys)

    def put_pin(self, server: str, tool: str, digest: str, tool_class: ToolClass | str) -> None:
        check_tool_key(server, tool, builtin_ok=False)
        check_text("digest", digest)
        cls = ToolClass(tool_class)
        with self.transaction():
            self._put(self._pins, (server, tool), {"server": server, "tool": tool, "digest": digest,
                                                   "tool_class": cls, "created_at": self.now()})

    def get_pin(self, server: str, tool: str) -> tuple[str, ToolClass] | None:
        with self._lock:
            row = self._pins.get((server, tool))
            return None if row is None else (row["digest"], row["tool_class"])

    def delete_pin(self, server: str, tool: str) -> bool:
        with self.transaction():
            return self._drop(self._pins, (server, tool))

    def list_pins(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(self._pins[k]) for k in sorted(self._pins)]

    # -- telemetry (core/telemetry.py) ------------------------------------------------------------------

    def record_telemetry(self, row: TelemetryRow) -> TelemetryRow:
        if not isinstance(row, TelemetryRow):
            raise TypeError(f"record_telemetry needs a TelemetryRow, got {row.__class__.__name__}")
        with self.transaction():
            self._telemetry_seq += 1  # never handed out twice, even when the transaction rolls back
            stored = row.model_copy(update={"id": self._telemetry_seq})
            self._telemetry.append(stored)
            self._log(lambda: self._telemetry.remove(stored))
        return stored

    def query_telemetry(self, *, origin: str | None = None, since: float | None = None,
                        limit: int = 1000, origin_prefix: str | None = None) -> list[TelemetryRow]:
        check_telemetry_query(origin, since, limit, origin_prefix)
        with self._lock:
            rows = [r for r in self._telemetry if (origin is None or r.origin == origin)
                    and (since is None or r.ts >= since)
                    and (origin_prefix is None or r.origin.startswith(origin_prefix))]
        return newest_first_limit(rows, limit)

    def prune_telemetry(self, before: float) -> int:
        check_telemetry_query(None, before, 0)
        with self.transaction():
            old = self._telemetry
            self._telemetry = [r for r in old if r.ts >= before]
            self._log(lambda: setattr(self, "_telemetry", old))
            return len(old) - len(self._telemetry)

    # -- team limits ------------------------------------------------------------------------------------

    def team_limits(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in sorted(self._team_limits.items())}

    def put_team_limits(self, team: str, limits: Mapping[str, Any], *, replace: bool = True) -> bool:
        body = check_team_limits(team, limits)
        with self.transaction():
            if not replace and team in self._team_limits:
                return False
            self._put(self._team_limits, team, body)
            return True

    # -- leases (process-local: a lease is alive while renewed within its ttl) --------------------------

    def acquire_lease(self, ttl: float = 30.0) -> str:
        if not ttl > 0:
            raise ValueError("lease ttl must be positive")
        owner = "own_" + secrets.token_hex(8)
        now = self.now()
        with self.transaction():
            self._put(self._leases, owner, {"owner_id": owner, "host": "memory", "pid": 0, "proc_start": None,
                                            "started_at": now, "renewed_at": now, "ttl": float(ttl)})
        self.owner_id, self.lease_ttl = owner, float(ttl)
        return owner

    def renew_lease(self) -> None:
        if self.owner_id is None:
            return
        now = self.now()
        with self.transaction():
            row = self._leases.get(self.owner_id) or {"owner_id": self.owner_id, "host": "memory", "pid": 0,
                                                      "proc_start": None, "started_at": now, "ttl": self.lease_ttl}
            self._put(self._leases, self.owner_id, {**row, "renewed_at": now})

    def release_lease(self) -> None:
        if self.owner_id is None:
            return
        with self.transaction():
            self._drop(self._leases, self.owner_id)
        self.owner_id = None

    def leases(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted((dict(r) for r in self._leases.values()), key=lambda r: r["started_at"], reverse=True)

    def live_owners(self) -> set[str]:
        return set(self.live_lease_starts())

    def live_lease_starts(self) -> dict[str, float]:
        """The live owners, each with the time its lease started (this store's own lease is alive)."""
        now = self.now()
        alive = {r["owner_id"]: float(r["started_at"]) for r in self.leases() if r["owner_id"] == self.owner_id
                 or float(r["renewed_at"]) + float(r["ttl"]) >= now}
        if self.owner_id is not None:
            alive.setdefault(self.owner_id, now)
        return alive

    def forget_dead_leases(self, live: set[str] | None = None) -> int:
        keep = self.live_owners() if live is None else set(live)
        with self.transaction():
            dead = [k for k in self._leases if k not in keep]
            for k in dead:
                self._drop(self._leases, k)
            return len(dead)


class MemoryCheckpoints:
    """The checkpoint journal of a :class:`MemoryStore` (same lock, same transactions)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._rows: dict[str, dict[str, Any]] = {}
        self._seq = 0

    @staticmethod
    def _public(row: dict[str, Any]) -> Checkpoint:
        return Checkpoint(**{k: v for k, v in row.items() if k not in ("pre_image", "owner")})

    def _select(self, keep: Callable[[dict[str, Any]], bool], *, newest_first: bool = False) -> list[Checkpoint]:
        with self._store._lock:
            rows = sorted((r for r in self._rows.values() if keep(r)), key=lambda r: r["seq"], reverse=newest_first)
            return [self._public(r) for r in rows]

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        with self._store._lock:
            row = self._rows.get(checkpoint_id)
            return None if row is None else self._public(row)

    def pre_image(self, checkpoint_id: str) -> bytes | None:
        with self._store._lock:
            row = self._rows.get(checkpoint_id)
            return None if row is None else row["pre_image"]

    def list(self, *, origin: str | None = None, limit: int = 100) -> list[Checkpoint]:
        return self._select(lambda r: origin is None or r["origin"] == origin, newest_first=True)[: max(0, limit)]

    def active(self, run_id: str, target: str) -> Checkpoint | None:
        found = self._select(lambda r: r["run_id"] == run_id and r["target"] == target
                             and r["state"] in ("prepared", "applied"), newest_first=True)
        return found[0] if found else None

    def cascade(self, checkpoint_id: str) -> list[Checkpoint]:
        sel = self.get(checkpoint_id)
        if sel is None:
            return []
        return self._select(lambda r: r["origin"] == sel.origin and r["seq"] >= sel.seq and r["state"] != "reverted",
                            newest_first=True)

    def unfinished(self, *, all_owners: bool = False) -> list[Checkpoint]:
        live = set() if all_owners else self._store.live_owners()
        return self._select(lambda r: r["state"] in ("prepared", "reverting")
                            and (all_owners or r["owner"] is None or r["owner"] not in live))

    def owner_of(self, checkpoint_id: str) -> str | None:
        with self._store._lock:
            row = self._rows.get(checkpoint_id)
            return None if row is None else row["owner"]

    def prepare(self, *, origin: str, conversation: str | None, run_id: str, target: str,
                pre_image: bytes | None, pending_sha256: str) -> Checkpoint:
        import hashlib

        now = self._store.now()
        cid = "ckpt_" + secrets.token_hex(8)
        with self._store.transaction():
            self._seq += 1
            self._store._put(self._rows, cid, {
                "seq": self._seq, "id": cid, "origin": origin, "conversation": conversation, "run_id": run_id,
                "target": target, "pre_exists": pre_image is not None,
                "pre_sha256": None if pre_image is None else hashlib.sha256(pre_image).hexdigest(),
                "post_sha256": None, "pending_sha256": pending_sha256, "state": "prepared", "note": "",
                "created_at": now, "updated_at": now, "pre_image": None if pre_image is None else bytes(pre_image),
                "owner": self._store.owner_id})
        got = self.get(cid)
        assert got is not None
        return got

    def _update(self, checkpoint_id: str, **values: Any) -> None:
        with self._store.transaction():
            row = self._rows.get(checkpoint_id)
            if row is not None:
                self._store._put(self._rows, checkpoint_id, {**row, **values, "updated_at": self._store.now()})

    def prepare_again(self, checkpoint_id: str, pending_sha256: str) -> None:
        self._update(checkpoint_id, state="prepared", pending_sha256=pending_sha256)

    def mark_applied(self, checkpoint_id: str, post_sha256: str | None, note: str = "") -> None:
        self._update(checkpoint_id, state="applied", post_sha256=post_sha256, pending_sha256=None, note=note)

    def mark_reverting(self, checkpoint_id: str) -> None:
        self._update(checkpoint_id, state="reverting")

    def mark_reverted(self, checkpoint_id: str, note: str = "") -> None:
        self._update(checkpoint_id, state="reverted", pre_image=None, pending_sha256=None, note=note)


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

    def tail(self, n: int = 100, *, origin: str | None = None,
             where: Callable[[AuditRecord], bool] | None = None) -> list[AuditRecord]:
        """The last ``n`` records (oldest first), optionally only those of ``origin`` and those ``where`` keeps."""
        if n <= 0:
            return []
        with self._lock:
            rows = [r for r in self._records if (origin is None or r.origin == origin) and (where is None or where(r))]
            return list(rows[-n:])

    def close(self) -> None:
        """Nothing to release."""

    @property
    def records(self) -> list[AuditRecord]:
        """Every record so far (a copy of the list)."""
        with self._lock:
            return list(self._records)


# One implementation, several names: code that needs one port names that port.
MemoryGrantStore = MemoryStore
MemoryLedger = MemoryStore
MemoryEventStore = MemoryStore
MemoryRunJournal = MemoryStore
