"""Errors of the storage layer.

They sit under :class:`relay_jupyter.core.errors.RelayError`, so the CLI and the server print their
one-line ``message`` instead of a traceback::

    RelayError
    └── StoreError          the database or audit log cannot be used (busy, closed, not a database, in use)
        ├── SchemaError     the database schema is newer than this code, or a migration failed
        └── StorageUnavailable   a write failed at run time (disk full, I/O error, read-only); also a
                            Refusal with code STORAGE_FULL / STORAGE_ERROR, so an RPC answers that code

Malformed arguments to a store method (an empty id, a negative amount, a non-dict payload) raise
``ValueError`` / ``TypeError``: they are programming errors of the caller, not user mistakes.
Unknown runs or calls raise ``KeyError``, matching :mod:`relay_jupyter.core.memory`.
"""

from __future__ import annotations

import errno
import sqlite3

from ..core.errors import Code, RelayError, Refusal

__all__ = ["SchemaError", "StorageUnavailable", "StoreError", "storage_failure"]


class StoreError(RelayError):
    """The store or the audit log cannot be used; ``message`` says what to do."""


class SchemaError(StoreError):
    """The on-disk schema is not one this code can use (too new, or a migration failed)."""


class StorageUnavailable(StoreError, Refusal):
    """A write to the store or the audit log failed at run time. ``code`` is STORAGE_FULL or
    STORAGE_ERROR; ``message`` is one sentence saying what the user can do."""

    def __init__(self, code: Code | str, message: str, *, data: dict | None = None) -> None:
        Refusal.__init__(self, code, message, data=data)


_FULL_MESSAGE = ("the disk holding the relay data directory ({where}) is full, so relay cannot record "
                 "anything; free some space there and run the cell again")
_ERROR_MESSAGE = ("relay could not write to its data directory ({where}: {reason}); check that disk "
                  "and its permissions, then run the cell again")


def storage_failure(exc: BaseException, where: str) -> StorageUnavailable:
    """The StorageUnavailable for a failed SQLite or OS write (``where``: the file or directory)."""
    full = False
    if isinstance(exc, sqlite3.Error):
        full = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == 13  # SQLITE_FULL
        reason = str(exc)
    elif isinstance(exc, OSError):
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        reason = exc.strerror or str(exc)
    else:
        reason = type(exc).__name__
    if full or "disk is full" in reason or "No space left" in reason:
        return StorageUnavailable(Code.STORAGE_FULL, _FULL_MESSAGE.format(where=where), data={"path": where})
    return StorageUnavailable(Code.STORAGE_ERROR, _ERROR_MESSAGE.format(where=where, reason=reason),
                              data={"path": where})
