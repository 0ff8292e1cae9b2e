"""Errors of the storage layer.

They sit under :class:`relay_jupyter.core.errors.RelayError`, so the CLI and the server print their
one-line ``message`` instead of a traceback::

    RelayError
    └── StoreError          the database or audit log cannot be used (busy, closed, not a database, in use)
        └── SchemaError     the database schema is newer than this code, or a migration failed

Malformed arguments to a store method (an empty id, a negative amount, a non-dict payload) raise
``ValueError`` / ``TypeError``: they are programming errors of the caller, not user mistakes.
Unknown runs or calls raise ``KeyError``, matching :mod:`relay_jupyter.core.memory`.
"""

from __future__ import annotations

from ..core.errors import RelayError

__all__ = ["SchemaError", "StoreError"]


class StoreError(RelayError):
    """The store or the audit log cannot be used; ``message`` says what to do."""


class SchemaError(StoreError):
    """The on-disk schema is not one this code can use (too new, or a migration failed)."""
