"""The telemetry table of both SQL stores (SQLite schema 6, PostgreSQL; core/telemetry.py, docs/telemetry.md)."""

from __future__ import annotations

from typing import Any

from ..core.telemetry import MAX_QUERY_ROWS, TelemetryRow, check_telemetry_query
from .dialect import SqlStore, where

__all__ = ["COLUMNS", "TelemetryMixin", "row_from_db", "row_values", "select_sql"]

#: The stored fields, in column order (``id`` first): the names of :class:`TelemetryRow`.
COLUMNS: tuple[str, ...] = ("id", "ts", "origin", "source", "model", "session", "lineage", "run_id", "profile",
                            "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                            "cost_usd", "estimated", "latency_ms", "ttft_ms", "status", "error_code")
_INSERT = COLUMNS[1:]


def row_values(row: TelemetryRow) -> tuple[Any, ...]:
    """The values of ``row`` for an INSERT of :data:`COLUMNS` without ``id`` (``estimated`` a bool:
    SQLite stores it as 1/0 in its INTEGER column, PostgreSQL in its BOOLEAN one)."""
    return tuple(bool(row.estimated) if c == "estimated" else getattr(row, c) for c in _INSERT)


def row_from_db(values: tuple[Any, ...]) -> TelemetryRow:
    """A stored row back as a model (validated: a row edited by hand in the file cannot smuggle text)."""
    data = dict(zip(COLUMNS, values, strict=True))
    data["estimated"] = bool(data["estimated"])
    return TelemetryRow.model_validate(data)


_INSERT_SQL = f"INSERT INTO telemetry ({','.join(_INSERT)}) VALUES ({','.join('?' * len(_INSERT))})"


def select_sql(origin: str | None, since: float | None, n: int, origin_prefix: str | None = None
               ) -> tuple[str, tuple[Any, ...]]:
    """The newest ``n`` rows (of ``origin``, whose origin starts with ``origin_prefix``, at or after ``since``): the
    statement (``?`` marks: a store passes it through its :class:`~relay_jupyter.storage.dialect.Dialect`) and its
    parameters. The prefix is compared with ``substr`` (as ``runs.list``'s, storage/journal.py), not ``LIKE``: no
    wildcard in a prefix to escape; in the statement, so the newest ``n`` are the newest of that prefix's rows."""
    cond, params = where([("origin = ?", origin), ("ts >= ?", None if since is None else float(since))])
    if origin_prefix is not None:
        cond = (cond + " AND " if cond else " WHERE ") + "substr(origin, 1, ?) = ?"
        params = [*params, len(origin_prefix), origin_prefix]
    return f"SELECT {','.join(COLUMNS)} FROM telemetry{cond} ORDER BY id DESC LIMIT ?", (*params, n)


class TelemetryMixin(SqlStore):
    """``TelemetryStore`` (core/telemetry.py), for both stores (PostgreSQL: in the user's own schema)."""

    def record_telemetry(self, row: TelemetryRow) -> TelemetryRow:
        if not isinstance(row, TelemetryRow):
            raise TypeError(f"record_telemetry needs a TelemetryRow, got {row.__class__.__name__}")
        with self.transaction() as conn:
            new_id = self.sql.insert_id(conn, self.sql(_INSERT_SQL), row_values(row))
        return row.model_copy(update={"id": new_id})

    def query_telemetry(self, *, origin: str | None = None, since: float | None = None,
                        limit: int = 1000, origin_prefix: str | None = None) -> list[TelemetryRow]:
        check_telemetry_query(origin, since, limit, origin_prefix)
        n = min(limit, MAX_QUERY_ROWS)
        if n <= 0:
            return []
        sql, params = select_sql(origin, since, n, origin_prefix)
        return [row_from_db(r) for r in reversed(self.query(self.sql(sql), params))]

    def prune_telemetry(self, before: float) -> int:
        check_telemetry_query(None, before, 0)
        with self.transaction() as conn:
            return conn.execute(self.sql("DELETE FROM telemetry WHERE ts < ?"), (float(before),)).rowcount
