"""Broker leases: who owns a run, a pending permission request, a checkpoint (issue 12).

Several brokers may share one data directory (the Jupyter server's broker and ``jupyter relay
serve`` both default to ``<jupyter data dir>/relay``). Each holds a lease: a row of ``owners``
with a random owner id, its host, pid and the process start time, renewed while it is alive.
Everything a broker writes that recovery may later settle carries that owner id.

An owner is **dead** when

- its row is gone (a broker that closed cleanly deletes its lease), or the thing has no owner at
  all (written before leases existed);
- it runs on this machine (same host name, boot id and pid namespace, so its pid means the same
  process here) and its pid is not alive, or belongs to a process that started at another time
  (the pid was reused);
- it runs elsewhere and its lease has not been renewed for ``ttl`` seconds (default 30; renewed
  every ``ttl / 3``).

Recovery and reconciliation touch only what belongs to a dead owner, so a second broker's start
never interrupts the first one's live runs nor settles its checkpoints.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from .dialect import SqlStore

__all__ = ["DEFAULT_LEASE_TTL", "LEASE_COLUMNS", "LeasesMixin", "host_identity", "lease_rows", "owner_alive", "process_start"]

DEFAULT_LEASE_TTL = 30.0


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def host_identity() -> str:
    """This machine as far as pids are concerned: host name, boot id and pid namespace (two
    containers with one host name still differ by their pid namespace)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return "|".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pidns))


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, from /proc), or None when it does not run
    (or /proc is not available: then only the pid is checked)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        if not os.path.isdir("/proc/self"):
            return _pid_alive_fallback(pid)
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields and fields[0] in ("Z", "X"):  # a zombie is dead for our purposes
        return None
    return fields[19] if len(fields) > 19 else "?"


def _pid_alive_fallback(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"


def owner_alive(row: dict[str, Any], now: float, *, me: str | None = None) -> bool:
    """Whether the owner of lease ``row`` is alive (rules in the module docstring)."""
    if me is not None and row["owner_id"] == me:
        return True
    if row["host"] == host_identity():
        start = process_start(int(row["pid"]))
        if start is None:
            return False
        return row["proc_start"] in (None, "?") or start in ("?", row["proc_start"])
    return float(row["renewed_at"]) + float(row["ttl"]) >= now


LEASE_COLUMNS = ("owner_id", "host", "pid", "proc_start", "started_at", "renewed_at", "ttl")
_INSERT_LEASE = f"INSERT INTO owners ({', '.join(LEASE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)"


def lease_rows(conn: Any) -> list[dict[str, Any]] | None:
    """Every lease row through a raw connection (the checkpoint journal's); None when the file has no
    ``owners`` table (a store older than schema 3 never opened it)."""
    try:
        rows = conn.execute(f"SELECT {', '.join(LEASE_COLUMNS)} FROM owners").fetchall()
    except sqlite3.OperationalError:
        return None
    return [dict(zip(LEASE_COLUMNS, r, strict=True)) for r in rows]


class LeasesMixin(SqlStore):
    """The ``owners`` table (both stores): acquire, renew and release this broker's lease; who is alive."""

    lease_ttl: float = DEFAULT_LEASE_TTL

    def acquire_lease(self, ttl: float = DEFAULT_LEASE_TTL) -> str:
        """Take a lease for this process; returns the new owner id.

        The owner id is this store's before the row is written: when the write fails (a full disk at
        start, StorageUnavailable raised) the broker still owns what it makes, and the next successful
        :meth:`probe_write` (the lease renewal, an upsert) writes the row. Without an owner id a live
        broker's runs were stored with owner None, which recovery reads as "a dead broker's"."""
        if not ttl > 0:
            raise ValueError("lease ttl must be positive")
        owner = "own_" + secrets.token_hex(8)
        self.owner_id, self.lease_ttl = owner, float(ttl)
        now = self.now()
        with self.transaction() as conn:
            conn.execute(self.sql(_INSERT_LEASE),
                         (owner, host_identity(), os.getpid(), process_start(os.getpid()), now, now, float(ttl)))
        return owner

    def renew_lease(self) -> None:
        """Renew this store's lease (re-creating it if another broker deleted it as dead). Raises
        StorageUnavailable when the store cannot be written: the broker's periodic storage probe."""
        if self.owner_id is None:
            return
        now = self.now()
        with self.transaction() as conn:
            conn.execute(self.sql(_INSERT_LEASE + " ON CONFLICT (owner_id) DO UPDATE SET renewed_at = excluded.renewed_at"),
                         (self.owner_id, host_identity(), os.getpid(), process_start(os.getpid()), now, now,
                          self.lease_ttl))

    def probe_write(self) -> None:
        """A real write (the lease renewal, or a row written and deleted) and a free-space check: the
        storage probe of the broker's maintenance loop and of a request arriving while the store had
        failed. Clears :attr:`storage_problem` when it succeeds and there is space; raises
        StorageUnavailable when it fails."""
        self.check_space()
        if self.owner_id is not None:
            self.renew_lease()
            return
        with self.transaction() as conn:
            conn.execute("INSERT INTO owners (owner_id, host, pid, proc_start, started_at, renewed_at, ttl) "
                         "VALUES ('probe', '', 0, NULL, 0, 0, 0) ON CONFLICT (owner_id) DO NOTHING")
            conn.execute("DELETE FROM owners WHERE owner_id = 'probe'")

    def release_lease(self) -> None:
        """Give the lease up (clean shutdown): whatever this broker left unfinished belongs to nobody."""
        if self.owner_id is None or self.closed:
            return
        try:
            with self.transaction() as conn:
                conn.execute(self.sql("DELETE FROM owners WHERE owner_id = ?"), (self.owner_id,))
        finally:
            self.owner_id = None

    def leases(self) -> list[dict[str, Any]]:
        """Every lease row (newest first)."""
        rows = self.query(f"SELECT {', '.join(LEASE_COLUMNS)} FROM owners ORDER BY started_at DESC")
        return [dict(zip(LEASE_COLUMNS, r, strict=True)) for r in rows]

    def live_owners(self) -> set[str]:
        """Owner ids that are alive now (this store's own lease always is)."""
        return set(self.live_lease_starts())

    def live_lease_starts(self) -> dict[str, float]:
        """The live owner ids, each with the time its lease started (``charge_dead_holds`` judges a
        hold without an owner by it); this store's own lease is alive (now, if its row is missing)."""
        now = self.now()
        alive = {r["owner_id"]: float(r["started_at"]) for r in self.leases() if owner_alive(r, now, me=self.owner_id)}
        if self.owner_id is not None:
            alive.setdefault(self.owner_id, now)
        return alive

    def forget_dead_leases(self, live: Iterable[str] | None = None) -> int:
        """Delete the lease rows of dead owners (after their things were recovered). Returns how many.

        Without ``live``, each row is judged from the same read that lists it: a lease another broker
        took after a live set was computed is never taken for a dead one (it was, when the live set
        and the rows came from two reads)."""
        if live is None:
            now = self.now()
            dead = [r["owner_id"] for r in self.leases() if not owner_alive(r, now, me=self.owner_id)]
        else:
            keep = set(live)
            dead = [r["owner_id"] for r in self.leases() if r["owner_id"] not in keep]
        if not dead:
            return 0
        with self.transaction() as conn:
            self.sql.executemany(conn, self.sql("DELETE FROM owners WHERE owner_id = ?"), [(d,) for d in dead])
        return len(dead)
