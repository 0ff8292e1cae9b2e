"""The store lock knows which thread holds it (storage/_db.StoreLock, a per-thread count instead of the
private ``RLock._is_owned``), and that is what sends a read to the right connection: inside the thread's own
transaction to the writer (it sees its uncommitted writes), from any other thread to the read connection (it
never waits behind a writer holding the lock, and sees only committed state)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from relay_jupyter.core.types import Grant
from relay_jupyter.storage import Store
from relay_jupyter.storage._db import StoreLock


_GRANT = Grant(origin="o1", tools=frozenset({"read_file"}), consent_id="c", created_at=1.0)


def _in_thread(fn) -> object:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)  # a deadlock guard, not a timing assertion
    assert not t.is_alive(), "the other thread is stuck"
    return out[0]


def test_held_counts_per_thread_and_nesting() -> None:
    lock = StoreLock()
    assert not lock.held()
    with lock:
        assert lock.held()
        with lock:
            assert lock.held()
        assert lock.held()  # the inner exit leaves the outer hold
        assert _in_thread(lock.held) is False  # another thread does not hold it
        assert _in_thread(lambda: lock.acquire(blocking=False)) is False  # and cannot take it
    assert not lock.held()
    assert _in_thread(lambda: (lock.acquire(), lock.held(), lock.release(), lock.held())[1::2]) == (True, False)


def test_a_release_by_a_thread_that_does_not_hold_it_is_refused_and_counts_nothing() -> None:
    lock = StoreLock()
    with pytest.raises(RuntimeError):
        lock.release()
    assert not lock.held()
    with lock:
        def foreign_release() -> str:
            try:
                lock.release()
            except RuntimeError:
                return "refused"
            return "released"

        assert _in_thread(foreign_release) == "refused"
        assert lock.held()
    assert not lock.held()
    assert lock.acquire(timeout=0)  # nobody else holds it: the refused release changed nothing
    lock.release()


def test_a_read_inside_the_threads_transaction_sees_its_uncommitted_write(tmp_path: Path) -> None:
    with Store.open(tmp_path / "relay.db") as store:
        with store.transaction():
            assert store._lock.held()
            store.put_grant(_GRANT)
            assert store.get_grant("o1") is not None  # the writer connection: its own uncommitted row
            assert store.query("SELECT COUNT(*) FROM grants") == [(1,)]
            # another thread reads the committed state from the read connection, without waiting for the lock
            assert _in_thread(lambda: store.get_grant("o1")) is None
            assert _in_thread(lambda: store.query("SELECT COUNT(*) FROM grants")) == [(0,)]
        assert not store._lock.held()
        assert _in_thread(lambda: store.get_grant("o1")) is not None


def test_a_rolled_back_transaction_leaves_no_hold(tmp_path: Path) -> None:
    with Store.open(tmp_path / "relay.db") as store:
        with pytest.raises(ZeroDivisionError), store.transaction():
            store.put_grant(_GRANT)
            1 / 0
        assert not store._lock.held()
        assert store.get_grant("o1") is None
        # free for another thread
        assert _in_thread(lambda: (store._lock.acquire(blocking=False), store._lock.release())[0]) is True
