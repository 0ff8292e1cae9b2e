"""OAuth token storage: the broker's 0600 secrets area, one file per (server, URL), nothing in a repr.

The OAuth flow itself (the MCP SDK's provider through relay's policy transport) is exercised end to end
by the conformance suite's authorization servers: ``tests/mcp/test_mcp_conformance.py`` (``auth/*``).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from relay_jupyter.mcp.oauth import FileTokenStore

TOKEN = "at-9d2f-very-secret"


@pytest.mark.asyncio
async def test_tokens_live_in_a_0600_file_in_a_0700_directory(tmp_path: Path) -> None:
    area = tmp_path / "data" / "mcp-oauth"
    store = FileTokenStore(area, "remote", "https://mcp.example.com/mcp")
    assert await store.get_tokens() is None
    await store.set_tokens(OAuthToken(access_token=TOKEN, token_type="Bearer", refresh_token="rt-1"))
    await store.set_client_info(OAuthClientInformationFull(client_id="c1", redirect_uris=["http://localhost/cb"]))
    assert stat.S_IMODE(area.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert (await store.get_tokens()).access_token == TOKEN
    assert (await store.get_client_info()).client_id == "c1"
    assert TOKEN not in repr(store) and "remote" not in store.path.name  # the name is a digest
    assert list(area.iterdir()) == [store.path]  # no temporary file left


@pytest.mark.asyncio
async def test_a_changed_url_never_gets_the_old_servers_token(tmp_path: Path) -> None:
    old = FileTokenStore(tmp_path, "remote", "https://mcp.example.com/mcp")
    await old.set_tokens(OAuthToken(access_token=TOKEN, token_type="Bearer"))
    moved = FileTokenStore(tmp_path, "remote", "https://evil.example.net/mcp")
    assert await moved.get_tokens() is None
    assert old.forget() and not old.forget()
    assert await old.get_tokens() is None
