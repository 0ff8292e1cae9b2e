"""The shipped throwaway cluster (relay_jupyter/testing/postgres.py): never a trust cluster."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from relay_jupyter.testing.postgres import PostgresCluster

pytestmark = pytest.mark.pg

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")


def test_role_needs_its_password(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.create_database()
    with psycopg.connect(url, password=postgres_cluster.password) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("relay",)
        # the role is no superuser: it owns its database and nothing more
        assert conn.execute("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = 'relay'").fetchone() \
            == (False, False)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)
    for password in (None, "", "wrong", postgres_cluster.password[:-1]):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, password=password, connect_timeout=5)
    # the superuser does not get in without its own password either
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres_cluster.url_for("postgres").replace("relay@", "postgres@"),
                        password=postgres_cluster.password, connect_timeout=5)


def test_files_are_private_and_hba_has_no_trust(postgres_cluster: PostgresCluster) -> None:
    pw = os.stat(postgres_cluster.password_file)
    assert stat.S_IMODE(pw.st_mode) == 0o600 and pw.st_uid == os.geteuid()
    sock = os.stat(postgres_cluster.socket_dir)
    assert stat.S_IMODE(sock.st_mode) == 0o700
    hba = [line.split() for line in (postgres_cluster.data_dir / "pg_hba.conf").read_text().splitlines()
           if line.strip() and not line.lstrip().startswith("#")]
    assert hba, "pg_hba.conf has no rules"
    assert {rule[-1] for rule in hba} <= {"peer", "scram-sha-256"}, hba
    # initdb's superuser password file is gone once the cluster is up
    assert not (postgres_cluster.root / "su.password").exists()  # type: ignore[operator]


def test_stop_stops_the_server_and_removes_its_files() -> None:
    cluster = PostgresCluster().start()
    port, root, secrets_dir = cluster.port, cluster.root, cluster.password_file.parent
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    cluster.stop()
    assert root is not None and not root.exists() and not secrets_dir.exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
