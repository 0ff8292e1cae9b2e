"""The embedded store: one SQLite file (WAL) for grants, the ledger, events, runs, conversations,
saved trust and tool pins. See docs/storage.md.

    store = Store.open()            # <jupyter data dir>/relay/relay.db, mode 0600
    store.put_grant(grant)
    store.append_events([...])
    store.close()

Implements :class:`relay_jupyter.core.ports.Store` (every port of the broker's persistence; the
contract suite ``relay_jupyter.testing.store_contract`` checks it). Thread-safe: one connection
behind one lock, shared by the checkpoint journal (:attr:`Store.checkpoints`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from .checkpoints import CheckpointJournal
from .events import EventsMixin
from .journal import JournalMixin
from .leases import LeasesMixin
from .paths import data_dir
from .records import ConversationsMixin, GrantsMixin, TrustMixin
from .telemetry import TelemetryMixin

__all__ = ["DB_NAME", "Store"]

DB_NAME = "relay.db"


class Store(GrantsMixin, EventsMixin, JournalMixin, ConversationsMixin, TrustMixin, LeasesMixin,
            TelemetryMixin):
    """SQLite store. Create with :meth:`open`; use as a context manager or call :meth:`close`.

    A broker takes a lease (:meth:`acquire_lease`, storage/leases.py) right after opening; CLI tools
    that only read or edit grants do not.
    """

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *,
             clock: Callable[[], float] = time.time) -> Store:
        """Open (creating and migrating) the database at ``path``, default ``data_dir() / "relay.db"``.

        ``clock`` stamps events, runs and records (tests pass a fake one).

        Raises:
            StoreError: the file is not a database, cannot use WAL, or is busy.
            SchemaError: the file was written by a newer relay-jupyter.
        """
        where = data_dir() / DB_NAME if path is None else Path(path)
        return cls(cls._connect(where), where, clock)

    _checkpoints: CheckpointJournal | None = None

    @property
    def checkpoints(self) -> CheckpointJournal:
        """The checkpoint journal on this store's connection; its entries carry :attr:`owner_id`."""
        if self._checkpoints is None:
            self._checkpoints = CheckpointJournal(database=self)
        return self._checkpoints
