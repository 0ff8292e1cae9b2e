"""SQLite's POSIX locks belong to the process: opening a second connection (the checkpoint journal) to
relay.db must not drop the store's locks, or another process's commits stop being visible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from relay_jupyter.core.types import Grant
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.storage.sqlite import Store

WRITER = """
import sys
from relay_jupyter.core.types import Grant
from relay_jupyter.storage.sqlite import Store
store = Store.open(sys.argv[1])
if sys.argv[2] == "put":
    store.put_grant(Grant(origin="notebook:x.ipynb", consent_id="terminal:1"))
else:
    store.delete_grant("notebook:x.ipynb")
store.close()
"""


def other_process(db: Path, action: str) -> None:
    subprocess.run([sys.executable, "-c", WRITER, str(db), action], check=True, timeout=60)


def test_commits_of_another_process_stay_visible_after_the_journal_opens(tmp_path: Path):
    db = tmp_path / "relay.db"
    store = Store.open(db)
    journal = CheckpointJournal(db)  # a second connection of this process to the same file
    try:
        other_process(db, "put")
        assert store.get_grant("notebook:x.ipynb") is not None
        other_process(db, "delete")  # its close must not checkpoint away the WAL under our feet
        assert store.get_grant("notebook:x.ipynb") is None
        store.put_grant(Grant(origin="notebook:y.ipynb", consent_id="c"))
        other_process(db, "put")
        assert {g.origin for g in store.list_grants()} == {"notebook:x.ipynb", "notebook:y.ipynb"}
    finally:
        journal.close()
        store.close()
