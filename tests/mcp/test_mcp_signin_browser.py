"""Sign-in to an OAuth MCP server from the side panel, clicked through in a real browser (issue 20 Deliver 2).

A real JupyterLab with the relay extension (its broker on disk: the tokens go to ``<data dir>/mcp-oauth``), an
mcp.json naming ``tests/mcp/oauth_mcp_server.py`` on 127.0.0.1 in its consent-page mode (the MCP SDK's server
auth; its authorization page is a real form with Allow / Deny), and headless Debian chromium. The person opens the
relay side panel, clicks "Sign in to remote", clicks the link (a new tab: relay never opens it itself), clicks
Allow on the authorization server's page; the browser is sent back to relay's redirect route, and the panel says
it is done. The broker lists the server's tool; no token reaches the panel, the callback page or the browser's
storage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from oauth_mcp_server import OAuthMcpServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kernel tests' rig, as pytest names it
from kernel.browser_rig import (  # noqa: E402
    ARTIFACTS,
    chromium,
    jp_asyncio_loop,  # noqa: F401 - the rig's replacement of pytest-jupyter's loop fixture
    jp_server_cleanup,  # noqa: F401
    open_relay_panel,
)
from kernel.real_server import TOKEN, RealServer  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _rpc(srv: RealServer, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})


def test_sign_in_from_the_side_panel_through_the_consent_page(tmp_path: Path) -> None:
    with OAuthMcpServer(consent_page=True) as oauth, chromium() as browser:
        mcp_json = tmp_path / "mcp.json"
        mcp_json.write_text(json.dumps({"mcpServers": {"remote": {"url": oauth.url}}}))
        data = tmp_path / "relaydata"
        with RealServer(tmp_path, {"in_memory": False, "data_dir": str(data), "mcp_config_path": str(mcp_json)},
                        lab=True) as srv:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.goto(f"{srv.url}lab?reset&token={TOKEN}")
            panel = open_relay_panel(page)
            section = panel.locator(".jp-relay-signins")
            button = section.get_by_role("button", name="Sign in to remote")
            try:
                button.wait_for(timeout=60_000)
                # the background connect said "needs sign-in" and waited for nobody
                listed = _rpc(srv, "mcp.sign_ins")["result"]["servers"]
                assert [(e["server"], e["has_token"]) for e in listed] == [("remote", False)], listed
                assert oauth.provider.authorized == 0 and not oauth.provider.consents
                # first the person says no on the authorization server's page: the panel says so, nothing is kept
                button.click()
                with context.expect_page() as opened:
                    section.locator("a.jp-relay-signin-link").click()
                refused = opened.value
                refused.get_by_role("button", name="Deny").click()
                refused.wait_for_load_state()
                section.get_by_text("sign-in failed").wait_for(timeout=60_000)
                refused.close()
                assert oauth.provider.tokens_issued == 0
                assert _rpc(srv, "mcp.sign_ins")["result"]["servers"][0]["has_token"] is False
                # then yes
                button.wait_for(timeout=30_000)
                button.click()
                link = section.locator("a.jp-relay-signin-link")
                link.wait_for(timeout=60_000)
                href = link.get_attribute("href") or ""
                assert link.get_attribute("target") == "_blank"
                assert link.get_attribute("rel") == "noopener noreferrer"
                query = parse_qs(urlsplit(href).query)
                assert urlsplit(href).port == oauth.port and query["code_challenge_method"] == ["S256"]
                assert "code_verifier" not in query
                assert f"127.0.0.1:{oauth.port}" in link.inner_text()
                # the link opens only on the person's click, in a new tab
                assert len(context.pages) == 1
                with context.expect_page() as opened:
                    link.click()
                consent = opened.value
                consent.wait_for_load_state()
                assert consent.url.startswith(f"http://127.0.0.1:{oauth.port}/consent?"), consent.url
                consent.get_by_text("relay-jupyter").wait_for(timeout=30_000)
                consent.get_by_role("button", name="Allow").click()
                # the authorization server sends the browser back to relay's redirect route (behind the login)
                consent.get_by_text("Signed in to remote").wait_for(timeout=30_000)
                landed = urlsplit(consent.url)
                assert landed.path.endswith("/relay/mcp-oauth/callback"), consent.url
                # the panel says it is done, without a reload
                section.get_by_text("signed in to remote").wait_for(timeout=60_000)
            finally:
                page.screenshot(path=str(ARTIFACTS / "mcp-signin-panel.png"), full_page=True)
            assert button.count() == 0 and section.locator("a.jp-relay-signin-link").count() == 0

            listed = _rpc(srv, "mcp.sign_ins")["result"]["servers"]
            assert [(e["server"], e["state"], e["has_token"], e["message"]) for e in listed] == [
                ("remote", "signed_in", True, "1 tools")], listed
            assert oauth.provider.authorized == 2 and oauth.provider.tokens_issued == 1

            # the tokens are the broker's alone: not in the panel, the callback page or anything the browser keeps
            secrets = [*oauth.provider.access, *oauth.provider.refresh]
            assert secrets and any(secrets[0] in f.read_text() for f in (data / "mcp-oauth").glob("*.json"))
            storage = page.evaluate("() => JSON.stringify([Object.entries(localStorage), document.cookie])")
            for secret in secrets:
                for where in (page.content(), consent.content(), storage, json.dumps(listed)):
                    assert secret not in where
            context.close()
