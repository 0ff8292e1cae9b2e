"""A throwaway PostgreSQL cluster for tests: ``initdb`` + ``pg_ctl`` on 127.0.0.1, stopped after.

    with PostgresCluster() as pg:               # about 1 s: initdb, start, a role and a database
        url = pg.url                            # postgresql://relay@127.0.0.1:PORT/relay (no password)
        pw = pg.password_file                   # the role's password, mode 0600
        db = pg.create_database()               # a fresh database owned by the role, its URL

The cluster is never a ``trust`` cluster (every local user could log in as superuser): local
socket connections use ``peer`` and TCP connections ``scram-sha-256``; the ``relay`` role has a
random password kept in a 0600 file, and the superuser ``postgres`` another, used only here to
create databases. The socket lives in a 0700 directory of the cluster's owner; the server listens
on 127.0.0.1 only, on a free port picked at start.

As root (CI, containers), ``initdb``/``pg_ctl`` refuse to run: they are run through
``runuser -u postgres`` on a directory owned by that system user (the Debian package creates it).
``pytest-postgresql``'s ``postgresql_proc`` fails as root for that reason, which is why this module
exists; :func:`find_bindir` finds Debian's ``/usr/lib/postgresql/<version>/bin`` or ``initdb`` on PATH.

Raises :class:`PostgresUnavailable` (whose message says "not installed") when no PostgreSQL server
binaries are found, so a test can skip on a developer's machine and fail in CI (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Self

__all__ = ["PostgresCluster", "PostgresUnavailable", "find_bindir"]

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresUnavailable(RuntimeError):
    """No usable PostgreSQL server binaries (initdb, pg_ctl, postgres) on this machine."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: ``$RELAY_PG_BINDIR``, the newest
    ``/usr/lib/postgresql/<version>/bin``, or where ``initdb`` is on PATH."""
    candidates: list[Path] = []
    if os.environ.get("RELAY_PG_BINDIR"):
        candidates.append(Path(os.environ["RELAY_PG_BINDIR"]))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted((p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [p / "bin" for p in versions]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    for bindir in candidates:
        if all(os.access(bindir / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise PostgresUnavailable("PostgreSQL is not installed (no initdb/pg_ctl/postgres found; "
                              "apt-get install postgresql, or set RELAY_PG_BINDIR)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_private(path: Path, text: str, uid: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    if uid is not None:
        os.chown(path, uid, -1)


class PostgresCluster:
    """One throwaway cluster; a context manager (``start`` / ``stop``). See the module docstring."""

    ROLE = "relay"
    DATABASE = "relay"

    def __init__(self, *, bindir: str | os.PathLike[str] | None = None, base_dir: str | None = None) -> None:
        self.bindir = Path(bindir) if bindir else find_bindir()
        self._base_dir = base_dir
        self.port = 0
        self.root: Path | None = None
        self._secrets_dir: Path | None = None
        self._superuser_password = ""
        self._running = False
        self._databases = 0
        self._as_root = os.geteuid() == 0
        if self._as_root:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("PostgreSQL is not installed for root: there is no 'postgres' system "
                                          "user to run the cluster as (apt-get install postgresql)") from exc
            if shutil.which("runuser") is None:
                raise PostgresUnavailable("runuser is not installed (util-linux): needed to run initdb as postgres")
        else:
            self._owner = pwd.getpwuid(os.geteuid())

    # -- paths ---------------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        assert self.root is not None, "the cluster is not started"
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.root is not None, "the cluster is not started"
        return self.root / "socket"

    @property
    def password_file(self) -> Path:
        """The ``relay`` role's password, mode 0600, owned by this process's user."""
        assert self._secrets_dir is not None, "the cluster is not started"
        return self._secrets_dir / "relay.password"

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def url(self) -> str:
        """The ``relay`` database's URL, without the password (safe to log)."""
        return self.url_for(self.DATABASE)

    def url_for(self, database: str) -> str:
        return f"postgresql://{self.ROLE}@127.0.0.1:{self.port}/{database}"

    # -- running -------------------------------------------------------------------------------
    def _run(self, *argv: str | os.PathLike[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in argv]
        if self._as_root:
            cmd = ["runuser", "-u", self._owner.pw_name, "--", *cmd]
        # a clean environment: no PG* variables of the caller, no locale surprises
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/", timeout=120,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{Path(cmd[4] if self._as_root else cmd[0]).name} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc

    def start(self) -> Self:
        """initdb (peer + scram-sha-256), start on a free 127.0.0.1 port, create the role and database."""
        base = self._base_dir or ("/tmp" if self._as_root else None)  # the postgres user must reach it
        root = Path(tempfile.mkdtemp(prefix="relay-pg-", dir=base))
        self.root = root
        self._secrets_dir = Path(tempfile.mkdtemp(prefix="relay-pg-secrets-"))
        try:
            uid, gid = self._owner.pw_uid, self._owner.pw_gid
            os.chmod(root, 0o700)
            self.socket_dir.mkdir(mode=0o700)
            if self._as_root:
                for p in (root, self.socket_dir):
                    os.chown(p, uid, gid)
            self._superuser_password = secrets.token_urlsafe(24)
            su_file = root / "su.password"  # read by initdb (as the cluster's owner), removed right after
            _write_private(su_file, self._superuser_password + "\n", uid if self._as_root else None)
            self._run(self.bindir / "initdb", "-D", self.data_dir, "-U", "postgres", "--pwfile", su_file,
                      "--auth-local=peer", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync")
            su_file.unlink()
            _write_private(self.password_file, secrets.token_urlsafe(24) + "\n")
            self._start_server()
            from psycopg import sql

            # CREATE ROLE takes no bound parameters: the password goes in as a quoted literal
            self._sql(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(self.ROLE),
                                                                          sql.Literal(self.password)))
            self._sql(f"CREATE DATABASE {self.DATABASE} OWNER {self.ROLE}")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self) -> None:
        last = ""
        for _ in range(5):  # the port was free a moment ago; another process may take it first
            self.port = _free_port()
            opts = (f"-k {self.socket_dir} -c listen_addresses=127.0.0.1 -p {self.port} -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c unix_socket_permissions=0700 "
                    "-c max_connections=200")
            proc = self._run(self.bindir / "pg_ctl", "-D", self.data_dir, "-l", self.root / "server.log",  # type: ignore[operator]
                             "-w", "-t", "60", "-o", opts, "start", check=False)
            if proc.returncode == 0:
                self._running = True
                return
            last = self._log_tail()
        raise RuntimeError(f"PostgreSQL did not start: {last}")

    def _log_tail(self) -> str:
        assert self.root is not None
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _sql(self, statement: Any, *, database: str = "postgres") -> None:
        """One statement as the superuser over TCP (scram): creates roles and databases."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             password=self._superuser_password, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database owned by the ``relay`` role; returns its URL (about 50 ms)."""
        self._databases += 1
        name = name or f"relay_t{self._databases}_{secrets.token_hex(3)}"
        if not _NAME.match(name):
            raise ValueError(f"not a plain database name: {name!r}")
        self._sql(f"CREATE DATABASE {name} OWNER {self.ROLE}")
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"not a plain database name: {name!r}")
        self._sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (immediate: nothing here is worth a checkpoint) and remove every file."""
        if self._running:
            self._running = False
            self._run(self.bindir / "pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "-t", "60", "stop",
                      check=False)
        for d in (self.root, self._secrets_dir):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
        self.root = self._secrets_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # a test that forgot stop() must not leave a server running
        with contextlib.suppress(Exception):
            if self._running:
                self.stop()
