"""The checkpoint journal of a store runs on the store's one SQLite connection (issue 14: no second
connection to relay.db, whose close could drop the other's POSIX locks)."""

from __future__ import annotations

import os
from pathlib import Path

from relay_jupyter.storage import Store


def _fds_on(path: Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                n += 1
        except OSError:
            continue
    return n


def test_store_checkpoints_open_no_second_connection(db_path: Path) -> None:
    with Store.open(db_path) as store:
        store.acquire_lease()
        before = _fds_on(db_path)
        assert before >= 1
        cp = store.checkpoints.prepare(origin="o", conversation=None, run_id="r", target="a.txt", pre_image=b"x",
                                       pending_sha256="0" * 64)
        store.checkpoints.mark_applied(cp.id, "1" * 64)
        assert _fds_on(db_path) == before
        assert store.checkpoints.owner_of(cp.id) == store.owner_id
        # the journal's writes are the store's: a store transaction that fails takes them back too
        try:
            with store.transaction():
                store.checkpoints.mark_reverted(cp.id, "undo me")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert store.checkpoints.get(cp.id).state == "applied"  # type: ignore[union-attr]
