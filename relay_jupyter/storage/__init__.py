"""relay_jupyter.storage: the embedded store (SQLite, WAL) and the JSON-lines audit log.

Public API: :class:`Store` (``storage.sqlite``), :class:`AuditLog` (``storage.audit_log``),
the schema (``storage.schema``), paths and atomic whole-file writes. See docs/storage.md.
"""

from __future__ import annotations

from .audit_log import AuditLog
from .errors import SchemaError, StoreError
from .schema import MIGRATIONS, SCHEMA_VERSION
from .sqlite import Store

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "AuditLog", "SchemaError", "Store", "StoreError"]
