"""``jupyter relay grants`` with ``c.RelayApp.store_url`` in the Jupyter config: a grant issued from the
terminal lands in the PostgreSQL store the broker reads (this user's namespace), not in a SQLite file
the broker never opens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pg

pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.storage.postgres import PostgresStore  # noqa: E402


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "cfg"), "JUPYTER_DATA_DIR": str(tmp / "data")}
    env.pop("JUPYTER_CONFIG_PATH", None)
    return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "grants", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_terminal_grants_reach_the_postgresql_store(postgres_db, tmp_path: Path) -> None:
    url, pw = postgres_db
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "jupyter_server_config.py").write_text(
        f"c.RelayApp.store_url = {url!r}\nc.RelayApp.store_password_file = {str(pw)!r}\nc.RelayApp.user = 'alice'\n")
    done = _cli(tmp_path, "add", "notebook:a.ipynb", "--tools", "read_file")
    assert done.returncode == 0, done.stderr
    with PostgresStore.open(url, password_file=pw, namespace="alice") as store:
        grant = store.get_grant("notebook:a.ipynb")
        assert grant is not None and grant.tools == frozenset({"read_file"})
    with PostgresStore.open(url, password_file=pw, namespace="bob") as store:
        assert store.get_grant("notebook:a.ipynb") is None  # alice's grant, not bob's
    listed = _cli(tmp_path, "list")
    assert listed.returncode == 0 and "notebook:a.ipynb" in listed.stdout
    assert not (tmp_path / "data" / "relay" / "relay.db").exists()  # no SQLite file on the side
    revoked = _cli(tmp_path, "revoke", "notebook:a.ipynb")
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    with PostgresStore.open(url, password_file=pw, namespace="alice") as store:
        assert store.get_grant("notebook:a.ipynb") is None
