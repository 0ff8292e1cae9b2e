"""The seams between the pure core and the layers that implement it.

Each port is a small Protocol; ``relay_jupyter.core.memory`` ships working in-memory
implementations (used by unit tests and as a reference), ``relay_jupyter.storage``
the durable SQLite / JSON-lines ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .types import AuditRecord, ConsentRequest, ConsentResult, Event, Grant

__all__ = ["GrantStore", "Ledger", "AuditSink", "ConsentPort", "EventStore", "RunJournal"]


@runtime_checkable
class GrantStore(Protocol):
    def get_grant(self, origin: str) -> Grant | None: ...
    def put_grant(self, grant: Grant) -> None:
        """Insert or replace. Narrowing checks are the caller's (``core.grants``) job."""
    def delete_grant(self, origin: str) -> bool: ...
    def list_grants(self) -> list[Grant]: ...


@runtime_checkable
class Ledger(Protocol):
    """Per-origin per-day usage. ``day`` is an ISO date string (UTC)."""

    def usage(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) committed so far."""
    def add_usage(self, origin: str, day: str, tokens: int, cost_usd: float) -> None: ...
    # Holds (reservations) of requests in flight, kept in the store itself so that every broker on
    # one data dir sees them: ``hold`` checks and inserts atomically (one transaction), ``finish_hold``
    # commits the usage and drops the hold in one transaction (see core/budgets.py).
    def held(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) held by live reservations."""
    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        """Charge expired holds; ``check(used_t, used_c, held_t, held_c)`` raises to refuse; else insert. Returns an id."""
    def finish_hold(self, hold_id: str, tokens: int | None, cost_usd: float | None) -> bool: ...
    def sweep_holds(self, now: float) -> int: ...


@runtime_checkable
class AuditSink(Protocol):
    def append(self, record: AuditRecord) -> AuditRecord:
        """Append and return the record with its sequence number set."""
    def tail(self, n: int = 100, *, origin: str | None = None) -> list[AuditRecord]: ...


@runtime_checkable
class ConsentPort(Protocol):
    async def ask(self, request: ConsentRequest) -> ConsentResult:
        """Decide allow | deny | timeout. Must return by ``request.deadline`` (TIMEOUT otherwise)."""


@runtime_checkable
class EventStore(Protocol):
    def append_event(self, type: str, data: dict[str, Any], *, origin: str | None = None,
                     run_id: str | None = None) -> Event: ...
    def append_events(self, items: Sequence[tuple[str, dict[str, Any], str | None, str | None]]) -> list[Event]:
        """Batch append of (type, data, origin, run_id); one transaction."""
    def events_since(self, since: int, *, limit: int | None = None) -> list[Event]: ...
    def last_event_id(self) -> int: ...


@runtime_checkable
class RunJournal(Protocol):
    """Durable run and tool-call records (DESIGN.md §4 durability)."""

    def run_started(self, run_id: str, origin: str, conversation: str, meta: dict[str, Any]) -> None: ...
    def run_finished(self, run_id: str, state: str, meta: dict[str, Any] | None = None) -> None: ...
    def call_intent(self, run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> None: ...
    def call_outcome(self, run_id: str, call_id: str, outcome: dict[str, Any]) -> None: ...
    def unfinished_runs(self) -> list[str]: ...
    def calls_without_outcome(self, run_id: str) -> list[dict[str, Any]]: ...
    def list_runs(self, *, origin: str | None = None, limit: int = 100) -> list[dict[str, Any]]: ...

