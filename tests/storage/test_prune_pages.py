"""prune_events (issue 18): paged deletes that let other writers in between, and a file that shrinks."""

from __future__ import annotations

import threading
from pathlib import Path

from relay_jupyter.storage import Store
from relay_jupyter.storage import events as events_module


def _size_after_checkpoint(store: Store) -> int:
    store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    return store.path.stat().st_size


def test_pruning_returns_space_to_the_file_system(db_path: Path) -> None:
    with Store.open(db_path) as store:
        assert store.query("PRAGMA auto_vacuum")[0][0] == 2  # incremental, for a new file
        blob = "x" * 2000
        for _ in range(20):
            store.append_events([("t", {"blob": blob}, None, None)] * 200)
        full = _size_after_checkpoint(store)
        assert store.prune_events(max_count=100) == 3900
        small = _size_after_checkpoint(store)
        assert small < full / 4, (full, small)
        assert store.query("PRAGMA freelist_count")[0][0] < 64
        assert [e.id for e in store.events_since(0)][:1] == [3901] and store.last_event_id() == 4000


def test_pruning_works_in_pages_and_writers_get_in_between(db_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(events_module, "PRUNE_PAGE", 100)
    with Store.open(db_path) as store:
        store.append_events([("t", {}, None, None)] * 1000)
        pages: list[int] = []
        original = store.transaction

        def counting():  # each page is a transaction of its own: count them, append between two
            pages.append(len(pages))
            if len(pages) == 3:
                writer = threading.Thread(target=lambda: store.append_event("late", {}))
                writer.start()
                writer.join()
            return original()

        monkeypatch.setattr(store, "transaction", counting)
        assert store.prune_events(max_count=0) == 1000
        monkeypatch.undo()
        assert len(pages) >= 10
        # the event appended during the pruning is younger than the edge decided at its start: kept
        assert [e.type for e in store.events_since(0)] == ["late"]
