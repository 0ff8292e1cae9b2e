"""The telemetry table of the SQLite store (schema 6; core/telemetry.py, docs/telemetry.md)."""

from __future__ import annotations

from typing import Any

from ..core.telemetry import MAX_QUERY_ROWS, TelemetryRow, check_telemetry_query
from ._db import Database

__all__ = ["COLUMNS", "TelemetryMixin", "row_from_db", "row_values"]

#: The stored fields, in column order (``id`` first): the names of :class:`TelemetryRow`.
COLUMNS: tuple[str, ...] = ("id", "ts", "origin", "source", "model", "session", "lineage", "run_id", "profile",
                            "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                            "cost_usd", "estimated", "latency_ms", "ttft_ms", "status", "error_code")
_INSERT = COLUMNS[1:]


def row_values(row: TelemetryRow) -> tuple[Any, ...]:
    """The values of ``row`` for an INSERT of :data:`COLUMNS` without ``id``."""
    return tuple(int(getattr(row, c)) if c == "estimated" else getattr(row, c) for c in _INSERT)


def row_from_db(values: tuple[Any, ...]) -> TelemetryRow:
    """A stored row back as a model (validated: a row edited by hand in the file cannot smuggle text)."""
    data = dict(zip(COLUMNS, values, strict=True))
    data["estimated"] = bool(data["estimated"])
    return TelemetryRow.model_validate(data)


class TelemetryMixin(Database):
    """``TelemetryStore`` (core/telemetry.py) on the store's one connection."""

    def record_telemetry(self, row: TelemetryRow) -> TelemetryRow:
        if not isinstance(row, TelemetryRow):
            raise TypeError(f"record_telemetry needs a TelemetryRow, got {row.__class__.__name__}")
        marks = ",".join("?" * len(_INSERT))
        with self.transaction() as conn:
            cur = conn.execute(f"INSERT INTO telemetry ({','.join(_INSERT)}) VALUES ({marks})", row_values(row))
            new_id = int(cur.lastrowid or 0)
        return row.model_copy(update={"id": new_id})

    def query_telemetry(self, *, origin: str | None = None, since: float | None = None,
                        limit: int = 1000) -> list[TelemetryRow]:
        check_telemetry_query(origin, since, limit)
        n = min(limit, MAX_QUERY_ROWS)
        if n <= 0:
            return []
        where, params = [], []
        if origin is not None:
            where.append("origin = ?")
            params.append(origin)
        if since is not None:
            where.append("ts >= ?")
            params.append(float(since))
        sql = (f"SELECT {','.join(COLUMNS)} FROM telemetry" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY id DESC LIMIT ?")
        rows = self.query(sql, (*params, n))
        return [row_from_db(r) for r in reversed(rows)]

    def prune_telemetry(self, before: float) -> int:
        check_telemetry_query(None, before, 0)
        with self.transaction() as conn:
            return conn.execute("DELETE FROM telemetry WHERE ts < ?", (float(before),)).rowcount
