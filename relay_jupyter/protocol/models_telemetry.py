"""Wire models of ``telemetry.query`` (docs/protocol.md, docs/telemetry.md)."""

from __future__ import annotations

from pydantic import Field

from ..core.telemetry import MAX_QUERY_ROWS, TelemetryRow
from .strict import Strict

__all__ = ["TelemetryQueryParams", "TelemetryQueryResult"]


class TelemetryQueryParams(Strict):
    since: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Only rows of requests that started at or after this time (UTC epoch seconds); all when omitted."""
    limit: int = Field(default=1000, ge=1, le=MAX_QUERY_ROWS)
    """At most this many rows: the newest ones, returned oldest first."""
    origin: str | None = Field(default=None, min_length=1, max_length=4096)
    """Browser only: the origin to read (every origin when omitted). A kernel omits it (or names its own)."""
    origin_prefix: str | None = Field(default=None, min_length=1, max_length=4096)
    """Only rows whose origin starts with this (``notebook:reports/``; a hub panel's must be under its user's
    ``user:<name>/``, its default): applied in the store, so the ``limit`` counts matching rows only."""


class TelemetryQueryResult(Strict):
    rows: list[TelemetryRow]
