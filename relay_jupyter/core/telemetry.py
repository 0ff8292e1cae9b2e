"""Per-request telemetry (issue 16 item 5): one row per model request, from the Anthropic- and
OpenAI-compatible endpoints (``source="proxy"``) and from ``%%agent`` runs (``source="agent"``).

A row holds *figures only*: who (origin), which conversation (session id, lineage kind), which model,
the tokens and cost that were charged, latency, time to first token, status. It never holds prompt or
answer text, headers, keys or credentials: every string field is a bounded identifier (an origin, a
model id, a session id that is either a safe header value or a hash, a relay code), checked by
:class:`TelemetryRow` itself, so no caller can put text into the table by mistake.

The one recording entry point is :meth:`Telemetry.record` (or :meth:`Telemetry.record_settled` with a
settled :class:`~relay_jupyter.core.budgets.Reservation`, which reads the charged usage, cost and the
``estimated`` flag from the gate's decision). The broker holds one :class:`Telemetry`
(``broker.telemetry``) over its store, with observers (the ``/metrics`` histograms) called per row.
Recording never raises into the request it describes: a storage failure is logged (type only) and the
row is dropped — telemetry is a view, the ledger and the audit are the record of spend.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .types import Usage

__all__ = [
    "LINEAGE_KINDS",
    "SOURCES",
    "STATUSES",
    "LineageKind",
    "Source",
    "Status",
    "Telemetry",
    "TelemetryRow",
    "TelemetryStore",
    "check_telemetry_query",
    "safe_session_id",
    "session_id_for",
]

log = logging.getLogger(__name__)

Source = Literal["proxy", "agent"]
SOURCES: tuple[str, ...] = ("proxy", "agent")

LineageKind = Literal["new", "continuation", "compaction", "undo", "diverged"]
LINEAGE_KINDS: tuple[str, ...] = ("new", "continuation", "compaction", "undo", "diverged")
"""``new``: the first request of a session; the other four as in core/lineage.py."""

Status = Literal["ok", "upstream_error", "interrupted", "error", "cancelled"]
STATUSES: tuple[str, ...] = ("ok", "upstream_error", "interrupted", "error", "cancelled")
"""``ok``: the answer completed; ``upstream_error``: the model server answered an HTTP error;
``interrupted``: the answer began and was cut (a client gone, a stream cut, a budget spent);
``error``: the server could not be reached or timed out; ``cancelled``: a run was stopped."""

#: What a session id may look like when it is stored as sent (a header value); anything else is
#: replaced by its hash (core/lineage.session_from_headers), so no free text reaches the table.
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_MAX_ORIGIN = 1024
_MAX_MODEL = 256
_MAX_ID = 128
#: Largest page one query returns.
MAX_QUERY_ROWS = 10_000


def safe_session_id(value: str) -> bool:
    """True when ``value`` may be stored as a session id as it is."""
    return isinstance(value, str) and SESSION_ID.fullmatch(value) is not None


def session_id_for(value: str) -> str:
    """``value`` itself when it is a safe session id, else ``sha256:`` and the first 32 hex digits of
    its SHA-256: a client's header or a conversation name never reaches the table as free text."""
    if safe_session_id(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _bounded(name: str, value: str, limit: int) -> str:
    if not value or len(value) > limit:
        raise ValueError(f"{name} must be 1..{limit} characters")
    if any(c in value for c in "\x00\r\n"):
        raise ValueError(f"{name} must be one line without NUL")
    return value


class TelemetryRow(BaseModel):
    """One model request. ``id`` is assigned by the store (0 before); ``ts`` is the wall-clock time
    the request started (seconds since the epoch, UTC). Token fields are what was *charged* (the
    server's usage, or the gate's estimate when ``estimated``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int = Field(default=0, ge=0)
    ts: float
    origin: str
    source: Source
    model: str
    session: str | None = None
    lineage: LineageKind | None = None
    run_id: str | None = None
    profile: str | None = None
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    estimated: bool = False
    latency_ms: float = Field(default=0.0, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    status: Status = "ok"
    error_code: str | None = None

    @field_validator("ts", "cost_usd", "latency_ms", "ttft_ms")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @field_validator("origin")
    @classmethod
    def _origin(cls, v: str) -> str:
        return _bounded("origin", v, _MAX_ORIGIN)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return _bounded("model", v, _MAX_MODEL)

    @field_validator("run_id", "profile")
    @classmethod
    def _ident(cls, v: str | None) -> str | None:
        if v is not None and not SESSION_ID.fullmatch(v):
            raise ValueError("must be an identifier (letters, digits, ._:@/+=-; at most 128)")
        return v

    @field_validator("session")
    @classmethod
    def _session(cls, v: str | None) -> str | None:
        if v is not None and not safe_session_id(v):
            raise ValueError("session must be a safe id (core/lineage.session_from_headers hashes others)")
        return v

    @field_validator("error_code")
    @classmethod
    def _code(cls, v: str | None) -> str | None:
        if v is not None and not _CODE.fullmatch(v):
            raise ValueError("error_code must be a code (letters, digits, _)")
        return v

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


def check_telemetry_query(origin: str | None, since: float | None, limit: int, origin_prefix: str | None = None
                          ) -> None:
    """The argument checks every store applies to :meth:`TelemetryStore.query_telemetry`."""
    if origin is not None and (not isinstance(origin, str) or not origin or "\x00" in origin):
        raise ValueError("origin must be a non-empty string without NUL")
    if origin_prefix is not None and (not isinstance(origin_prefix, str) or not origin_prefix
                                      or "\x00" in origin_prefix):
        raise ValueError("origin_prefix must be a non-empty string without NUL")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)
                              or not math.isfinite(since)):
        raise TypeError("since must be a finite number (seconds since the epoch)")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be an int")


@runtime_checkable
class TelemetryStore(Protocol):
    """The telemetry table of a store (part of :class:`~relay_jupyter.core.ports.Store`)."""

    def record_telemetry(self, row: TelemetryRow) -> TelemetryRow:
        """Append one row; returns it with its ``id`` (strictly increasing, never reused). TypeError
        for anything but a :class:`TelemetryRow`."""
    def query_telemetry(self, *, origin: str | None = None, since: float | None = None,
                        limit: int = 1000, origin_prefix: str | None = None) -> list[TelemetryRow]:
        """Rows with ``ts >= since`` (every row when None) of ``origin`` (every origin when None) whose origin
        starts with ``origin_prefix`` (a hub user's ``user:<name>/``; every origin when None): the newest ``limit``
        of them (at most :data:`MAX_QUERY_ROWS`; <= 0: none), oldest first."""
    def prune_telemetry(self, before: float) -> int:
        """Delete the rows with ``ts < before``; returns how many."""


Observer = Callable[[TelemetryRow], None]


class Telemetry:
    """The broker's recorder: validates a row, stores it, tells the observers (``/metrics``)."""

    def __init__(self, store: TelemetryStore, *, clock: Callable[[], float] = time.time,
                 observers: Iterable[Observer] = ()) -> None:
        self.store = store
        self._clock = clock
        self._observers: list[Observer] = list(observers)

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def now(self) -> float:
        return self._clock()

    def record(self, *, origin: str, model: str, source: Source, status: Status = "ok",
               usage: Usage | None = None, cost_usd: float = 0.0, estimated: bool = False,
               latency_ms: float = 0.0, ttft_ms: float | None = None, session: str | None = None,
               lineage: LineageKind | None = None, run_id: str | None = None, profile: str | None = None,
               error_code: str | None = None, ts: float | None = None) -> TelemetryRow | None:
        """Record one finished model request; returns the stored row, or None when it could not be
        stored (logged). ``ts``: when the request started (default: now minus ``latency_ms``).

        Raises:
            pydantic.ValidationError: a malformed field (a programming error of the caller: an
                unbounded string, a negative count, free text where an id belongs).
        """
        u = usage if usage is not None else Usage()
        latency = max(0.0, float(latency_ms))
        row = TelemetryRow(
            ts=float(ts) if ts is not None else self.now() - latency / 1000.0,
            origin=origin, source=source, model=model, session=session, lineage=lineage, run_id=run_id,
            profile=profile, input_tokens=u.input_tokens, output_tokens=u.output_tokens,
            cache_read_tokens=u.cache_read_input_tokens, cache_write_tokens=u.cache_creation_input_tokens,
            cost_usd=max(0.0, float(cost_usd)), estimated=bool(estimated), latency_ms=latency,
            ttft_ms=None if ttft_ms is None else max(0.0, float(ttft_ms)), status=status, error_code=error_code)
        try:
            stored = self.store.record_telemetry(row)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks the request it describes
            log.warning("relay telemetry: a row could not be stored (%s)", type(exc).__name__)
            return None
        for observer in self._observers:
            try:
                observer(stored)
            except Exception:  # noqa: BLE001 - an observer bug must not lose the row or the answer
                log.exception("relay telemetry: an observer failed")
        return stored

    def record_settled(self, reservation: Any, *, model: str, source: Source, status: Status = "ok",
                       latency_ms: float = 0.0, ttft_ms: float | None = None, session: str | None = None,
                       lineage: LineageKind | None = None, run_id: str | None = None,
                       profile: str | None = None, error_code: str | None = None,
                       ts: float | None = None) -> TelemetryRow | None:
        """:meth:`record` for a request the gate settled: the tokens, cost and ``estimated`` flag are
        the gate's charge (``reservation.charge`` / ``charged_usd``, core/budgets.judge_usage): the
        server's usage when it reported a sane one, else the estimate or reservation charged."""
        charge = getattr(reservation, "charge", None)
        cost = getattr(reservation, "charged_usd", None)
        usage: Usage | None = None
        estimated = True
        if charge is not None:
            estimated = charge.basis not in ("reported", "refused")
            if charge.usage is not None:
                usage = charge.usage
            else:  # the whole reservation: its split when known
                est = getattr(reservation, "estimate", None)
                inp = min(est.input_tokens, charge.tokens) if est is not None else charge.tokens
                usage = Usage(input_tokens=inp, output_tokens=charge.tokens - inp)
        origin = getattr(reservation, "origin", None)
        if not isinstance(origin, str):
            raise TypeError("reservation must come from Gate.begin_completion()")
        return self.record(origin=origin, model=model, source=source, status=status, usage=usage,
                           cost_usd=float(cost or 0.0), estimated=estimated, latency_ms=latency_ms,
                           ttft_ms=ttft_ms, session=session, lineage=lineage, run_id=run_id, profile=profile,
                           error_code=error_code, ts=ts)

    def query(self, *, origin: str | None = None, since: float | None = None,
              limit: int = 1000, origin_prefix: str | None = None) -> list[TelemetryRow]:
        if origin_prefix is None:  # a Store of another package written before origin_prefix still works without it
            return self.store.query_telemetry(origin=origin, since=since, limit=limit)
        return self.store.query_telemetry(origin=origin, since=since, limit=limit, origin_prefix=origin_prefix)


def newest_first_limit(rows: Collection[TelemetryRow], limit: int) -> list[TelemetryRow]:
    """The newest ``limit`` of ``rows`` (ordered by id), oldest first: the query's page rule."""
    n = max(0, min(int(limit), MAX_QUERY_ROWS))
    ordered = sorted(rows, key=lambda r: r.id)
    return ordered[len(ordered) - n:] if n else []
