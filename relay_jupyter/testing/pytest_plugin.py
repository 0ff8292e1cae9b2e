"""pytest fixtures for testing notebooks and code against relay-jupyter's fakes.

Installed as a pytest plugin (entry point ``pytest11: relay_jupyter``), so after
``pip install relay-jupyter`` these fixtures exist in every test session:

- ``fake_anthropic``: a started :class:`~relay_jupyter.testing.FakeAnthropic` requiring ``FAKE_API_KEY``.
- ``fake_openai``: a started :class:`~relay_jupyter.testing.FakeOpenAI` requiring ``FAKE_API_KEY``.
- ``mcp_http_server``: the test MCP server over Streamable HTTP on 127.0.0.1 (notes dir under tmp_path).
- ``relay_data_dir``: a temporary ``JUPYTER_DATA_DIR``; returns the ``relay/`` data folder inside it.
- ``postgres_cluster``: a throwaway PostgreSQL cluster for the session (``testing.postgres.PostgresCluster``:
  127.0.0.1, scram-sha-256, a role whose password is in a 0600 file); skips when PostgreSQL is not installed.
- ``postgres_db``: a fresh database in that cluster for one test: ``(url, password_file)``.

Each server fixture is started for one test and stopped after it. Heavy imports happen inside the
fixtures, so merely having the plugin installed costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .fake_anthropic import FakeAnthropic
    from .fake_openai import FakeOpenAI
    from .mcp_server import McpHttpServer
    from .postgres import PostgresCluster

__all__ = ["FAKE_API_KEY", "fake_anthropic", "fake_openai", "mcp_http_server", "postgres_cluster", "postgres_db",
           "relay_data_dir"]

#: The key the fixture fakes accept (``fake.api_key``); any other key gets 401.
FAKE_API_KEY = "sk-fake-relay-test-key"


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    """A fake Anthropic Messages API for this test: ``fake_anthropic.base_url``, ``.api_key``,
    ``.enqueue(...)``, ``.requests``."""
    from .fake_anthropic import FakeAnthropic

    with FakeAnthropic(api_key=FAKE_API_KEY) as fake:
        yield fake


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible chat completions API for this test (``base_url`` ends in ``/v1``)."""
    from .fake_openai import FakeOpenAI

    with FakeOpenAI(api_key=FAKE_API_KEY) as fake:
        yield fake


@pytest.fixture
def mcp_http_server(tmp_path: Path) -> Iterator[McpHttpServer]:
    """The test MCP server over Streamable HTTP; ``.url``; write tools write under ``.directory``."""
    from .mcp_server import McpHttpServer

    notes = tmp_path / "mcp-notes"
    notes.mkdir()
    with McpHttpServer(notes) as server:
        yield server


@pytest.fixture
def relay_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``JUPYTER_DATA_DIR`` at a fresh temporary folder; returns ``<it>/relay`` (created, 0700),
    where relay-jupyter keeps its store and audit log."""
    from ..storage.paths import data_dir

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    return data_dir(create=True)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL cluster for the test session, stopped (and its files removed) at the end.

    Skips with "PostgreSQL is not installed" when there are no server binaries or no psycopg (a CI
    run turns that skip into a failure: tests/conftest.py)."""
    from .postgres import PostgresCluster, PostgresUnavailable

    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'relay-jupyter[postgres]')")
    try:
        cluster = PostgresCluster()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    with cluster:
        yield cluster


@pytest.fixture
def postgres_db(postgres_cluster: PostgresCluster) -> Iterator[tuple[str, Path]]:
    """A new database of :func:`postgres_cluster` for this test: ``(url without password, password file)``.
    Dropped after the test."""
    url = postgres_cluster.create_database()
    yield url, postgres_cluster.password_file
    postgres_cluster.drop_database(url.rsplit("/", 1)[1])
