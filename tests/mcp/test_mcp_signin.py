"""OAuth sign-in switched on (issue 20 item 2), end to end against a local OAuth-protected MCP server.

A real Jupyter server (pytest-jupyter) whose mcp.json names ``tests/mcp/oauth_mcp_server.py`` on 127.0.0.1 (the
MCP SDK's server auth: protected-resource and authorization-server metadata, dynamic client registration,
authorize, token with PKCE). The background connect fails with "needs sign-in" (never "unreachable", and never
waits for a person); ``mcp.sign_in`` gives the card's link; the "browser" (httpx2, no redirect followed) opens
it, the authorization server sends it back to relay's redirect route, which is behind Jupyter's login; the
broker exchanges the code, keeps the token in a 0600 file, lists the tools, and calls one. The token never
appears in an RPC answer, an event, the audit or a log line; a forged or replayed state is refused; sign-out
forgets it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from oauth_mcp_server import OAuthMcpServer

from relay_jupyter.kernel.widgets.signin_card import SignInCard, signin_text


@pytest.fixture
def oauth_server():
    with OAuthMcpServer() as srv:
        yield srv


@pytest.fixture
def jp_server_config(tmp_path, oauth_server):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"remote": {"url": oauth_server.url}}}))
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "consent_timeout": 5.0, "mcp_config_path": str(config)},
    }


async def _status(broker, name: str = "remote"):
    return next(s for s in broker.mcp.status() if s.name == name)


async def test_sign_in_end_to_end(jp_fetch, jp_serverapp, oauth_server, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    app = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app
    broker = app.broker
    token = jp_serverapp.identity_provider.token
    if getattr(app, "_mcp_start", None) is None:  # pytest-jupyter does not run the started-server hook itself
        await app._start_jupyter_server_extension(jp_serverapp)

    async def rpc(method: str, params: dict) -> dict:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        resp = await jp_fetch("relay", "rpc", method="POST", body=body)
        return json.loads(resp.body)

    # the background connect: "needs sign-in", never "could not be reached", and it did not wait for anyone
    async with asyncio.timeout(30):
        while (await _status(broker)).error is None:
            await asyncio.sleep(0.05)
    status = await _status(broker)
    assert status.state == "failed" and "needs sign-in" in status.error and "relay.sign_in('remote')" in status.error
    assert "could not be reached" not in status.error and oauth_server.provider.authorized == 0
    # the side panel's list (mcp.sign_ins): the server needs sign-in, the broker holds no token
    [listed] = (await rpc("mcp.sign_ins", {}))["result"]["servers"]
    assert (listed["server"], listed["host"], listed["state"], listed["has_token"]) == (
        "remote", "127.0.0.1", "needs_sign_in", False), listed
    assert "needs sign-in" in listed["message"] and listed["authorization_url"] is None

    def changes() -> list[tuple[str | None, dict]]:
        return [(e.origin, e.data) for e in broker.store.events_since(0) if e.type == "mcp.sign_in_changed"]

    async def changed(n: int) -> list[tuple[str | None, dict]]:
        async with asyncio.timeout(10):  # the flow's end is announced by its task's done callback
            while len(changes()) < n:
                await asyncio.sleep(0.02)
        return changes()

    assert changes() == []  # the background connect's "needs sign-in" is no sign-in started
    started = (await rpc("mcp.sign_in", {"server": "remote"}))["result"]
    assert started["state"] == "pending", started
    # the panel refreshes on mcp.sign_in_changed (no poll): the server's name and the state, nothing else (no link,
    # no state parameter); the browser session named no origin, so it is the Jupyter server's broadcast
    assert changes() == [(None, {"server": "remote", "state": "pending"})]
    # a panel opened (or reloaded) now finds the same sign-in and its link, not a new one
    [listed] = (await rpc("mcp.sign_ins", {}))["result"]["servers"]
    assert (listed["state"], listed["sign_in_id"], listed["authorization_url"]) == (
        "pending", started["sign_in_id"], started["authorization_url"])
    url = started["authorization_url"]
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert parts.hostname == "127.0.0.1" and parts.port == oauth_server.port
    assert query["code_challenge_method"] == ["S256"] and "code_verifier" not in query
    redirect_uri = query["redirect_uri"][0]
    assert redirect_uri.endswith("/relay/mcp-oauth/callback")

    async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as browser:
        # the person approves on the authorization server's page: it sends the browser back to relay
        approved = await browser.get(url)
        assert approved.status_code in (302, 303, 307), approved.text
        back = approved.headers["location"]
        assert back.startswith(redirect_uri)
        code_state = parse_qs(urlsplit(back).query)
        # a forged state is refused, even from a logged-in browser
        forged = await browser.get(redirect_uri, params={"code": code_state["code"][0], "state": "forged"},
                                   headers={"Authorization": f"token {token}"})
        assert forged.status_code == 400
        # without Jupyter's login the redirect route lands nothing (sent to the login page / refused)
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as stranger:  # no login cookie
            anonymous = await stranger.get(back)
        assert anonymous.status_code in (302, 403), (anonymous.status_code, anonymous.text[:300], dict(anonymous.headers))
        assert (await rpc("mcp.sign_in_wait", {"sign_in_id": started["sign_in_id"], "timeout": 0}))["result"][
            "state"] == "pending"
        landed = await browser.get(back, headers={"Authorization": f"token {token}"})
        assert landed.status_code == 200 and "Signed in to remote" in landed.text
        assert code_state["code"][0] not in landed.text
        replayed = await browser.get(back, headers={"Authorization": f"token {token}"})
        assert replayed.status_code == 400  # each state is used once

    done = (await rpc("mcp.sign_in_wait", {"sign_in_id": started["sign_in_id"], "timeout": 30}))["result"]
    assert done["state"] == "signed_in", done
    assert (await changed(2))[1:] == [(None, {"server": "remote", "state": "signed_in"})]
    # a sign-in started from a kernel (relay.sign_in in a cell) is announced with that notebook's origin
    kernel_side = await broker.mcp.start_sign_in("remote")  # holds a valid token: signed in without a person
    from relay_jupyter.broker.mcp_signin import announce_sign_in

    announce_sign_in(broker, kernel_side, "nb-signin-1")
    assert (await changed(3))[2:] == [("nb-signin-1", {"server": "remote", "state": "signed_in"})]
    status = await _status(broker)
    assert status.state == "connected" and status.tools == 1
    signed_in_list = (await rpc("mcp.sign_ins", {}))["result"]
    assert [(e["state"], e["has_token"], e["sign_in_id"]) for e in signed_in_list["servers"]] == [
        ("signed_in", True, None)], signed_in_list
    result = await broker.mcp.call("remote__whoami", {})
    assert result["content"] == "signed in" and oauth_server.calls == ["whoami"]
    assert oauth_server.provider.registered == 1 and oauth_server.provider.tokens_issued == 1

    # the tokens live only in the broker's 0600 file in a 0700 directory
    oauth_dir = tmp_path / "relaydata" / "mcp-oauth"
    files = list(oauth_dir.glob("*.json"))
    assert len(files) == 1
    assert stat.S_IMODE(os.stat(oauth_dir).st_mode) == 0o700 and stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    access = next(iter(oauth_server.provider.access))
    refresh = next(iter(oauth_server.provider.refresh))
    assert access in files[0].read_text()
    events = json.dumps([e.data for e in broker.store.events_since(0)])
    audit = "".join(p.read_text() for p in (tmp_path / "relaydata").glob("audit*"))
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (access, refresh):
        assert secret not in events and secret not in audit and secret not in logs
        assert secret not in json.dumps(started) and secret not in json.dumps(done)
        assert secret not in json.dumps(signed_in_list)

    # a reconnect uses the stored token: no second sign-in
    await broker.mcp._servers["remote"].connection.close(force=True)
    await broker.mcp.refresh("remote")
    assert (await _status(broker)).state == "connected" and oauth_server.provider.authorized == 1

    # sign-out forgets it: the next connect needs sign-in again
    out = (await rpc("mcp.sign_out", {"server": "remote"}))["result"]
    assert out == {"server": "remote", "signed_out": True}
    assert changes()[-1] == (None, {"server": "remote", "state": "signed_out"})
    announced = json.dumps(changes())
    for secret in (access, refresh, url, query["state"][0], code_state["code"][0], "http"):
        assert secret not in announced, secret
    # the live session ended with the token; the reconnect after it is "needs sign-in" again and holds no token
    # (it may register a fresh client: the file then has only that registration)
    assert not any(access in f.read_text() or "tokens" in json.loads(f.read_text()) for f in oauth_dir.glob("*.json"))
    assert (await _status(broker)).state == "failed" and "needs sign-in" in (await _status(broker)).error
    [listed] = (await rpc("mcp.sign_ins", {}))["result"]["servers"]
    assert (listed["state"], listed["has_token"]) == ("needs_sign_in", False), listed


async def test_sign_in_to_an_unknown_or_stdio_server_is_one_line(jp_fetch, jp_serverapp) -> None:
    app = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "mcp.sign_in", "params": {"server": "nope"}})
    answer = json.loads((await jp_fetch("relay", "rpc", method="POST", body=body)).body)
    assert answer["error"]["data"]["code"] == "NOT_FOUND" and "\n" not in answer["error"]["message"]


def test_the_card_shows_an_escaped_name_and_only_an_absolute_https_or_loopback_link() -> None:
    card = SignInCard("remote<script>", "https://auth.example/authorize?state=s&code_challenge=c")
    fragment = card._fragment("waiting")
    assert "<script>" not in fragment and "remote&lt;script&gt;" in fragment
    assert 'href="https://auth.example/authorize?state=s&amp;code_challenge=c"' in fragment
    from relay_jupyter.kernel.rendering import chrome_html

    hostile = chrome_html(SignInCard("x", "javascript:alert(1)")._fragment("w"))
    assert "javascript:" not in hostile.split("</a>")[0].split(">")[0]
    assert "remote" in signin_text("remote", None, "waiting")
