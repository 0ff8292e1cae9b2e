"""The gated MCP gateway (broker/mcp_gateway.py) driven by the official ``mcp`` SDK client over Streamable HTTP.

A real broker (SQLite store, gate, permission router, audit log) with the shipped test MCP server over
stdio as the user's server; the SDK client is the outside agent. It sees only the origin's granted
tools, a pinned read runs without a card, a write waits for the card of the session's originator (denied:
nothing written; approved: written), and every call is audited. Tokens: missing, wrong, revoked, in the
URL, or from a foreign page are refused, and the token is never in a log, an event or the audit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_support import relay_test_server

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.mcp_gateway import mcp_gateway_of
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Code, RoutingRefusal
from relay_jupyter.core.types import Grant, ToolClass
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp.config import McpConfig
from relay_jupyter.protocol.names import EventType

pytestmark = pytest.mark.asyncio

KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:gw.ipynb", client_id="kernel:gwk")
OTHER = Caller(kind=CallerKind.KERNEL, origin="notebook:other.ipynb", client_id="kernel:otherk")


class Rig:
    def __init__(self, tmp_path: Path, notes: Path) -> None:
        self.notes = notes
        self.broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", consent_timeout=60))
        self.broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"t__echo", "t__write_note"}),
                                       models=frozenset({"*"}), consent_id="c"))
        self.registry = McpRegistry(McpConfig(servers={"t": relay_test_server("t", notes)}), self.broker.store,
                                    shutdown_grace=0.5)
        self.broker.mcp = self.registry
        self.gateway = mcp_gateway_of(self.broker)

    async def __aenter__(self) -> Rig:
        await self.registry.start()
        self.registry.pin("t__echo", ToolClass.READ)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.gateway.aclose()
        await self.registry.stop()
        self.broker.close()

    def events(self, type: str) -> list[Any]:
        return [e for e in self.broker.store.events_since(0) if e.type == type]

    async def wait_event(self, type: str, n: int = 1) -> Any:
        async with asyncio.timeout(30):
            while len(self.events(type)) < n:
                await asyncio.sleep(0.02)
        return self.events(type)[n - 1]

    def audit_text(self) -> str:
        path = Path(self.broker.config.data_dir) / "audit.jsonl"
        return path.read_text() if path.exists() else ""


def _client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60))
    return Client(streamable_http_client(url, http_client=http))


async def test_an_sdk_client_gets_the_granted_tools_only_through_the_gate(tmp_path: Path, notes: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with asyncio.timeout(90), Rig(tmp_path, notes) as rig:
        session = await rig.gateway.session(KERNEL.origin, originator=KERNEL.client_id, label="test")
        assert session.url.startswith("http://127.0.0.1:") and session.token not in repr(session)
        assert session.client_config() == {"type": "http", "url": session.url,
                                           "headers": {"Authorization": f"Bearer {session.token}"}}
        async with _client(session.url, session.token) as client:
            listed = await client.list_tools()
            names = sorted(t.name for t in listed.tools)
            # granted only: not delete_note, add, ... ; kernel tools and workspace tools are not granted here
            assert names == ["t__echo", "t__write_note"]
            by_name = {t.name: t for t in listed.tools}
            assert by_name["t__echo"].annotations.read_only_hint is True
            assert by_name["t__write_note"].annotations.read_only_hint is False

            # a pinned read runs without a card
            echoed = await client.call_tool("t__echo", {"text": "hello gateway"})
            assert not echoed.is_error and echoed.content[0].text == "hello gateway"
            assert rig.events(EventType.PERMISSION_REQUEST) == []

            # a write waits for the originator's card: denied -> nothing written
            denied = asyncio.ensure_future(client.call_tool("t__write_note", {"path": "n.txt", "text": "x"}))
            card = await rig.wait_event(EventType.PERMISSION_REQUEST)
            assert card.origin == KERNEL.origin and card.data["tool"] == "t__write_note"
            assert card.data["originator"] == KERNEL.client_id
            assert not denied.done()
            # another notebook's kernel cannot answer it
            with pytest.raises(RoutingRefusal) as refused_answer:
                await call_method(rig.broker, OTHER, "permission.answer",
                                  {"request_id": card.data["request_id"], "decision": "allow"})
            assert refused_answer.value.code is Code.NOT_ORIGINATOR
            await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": card.data["request_id"], "decision": "deny"})
            result = await denied
            assert result.is_error and result.content[0].text.startswith("refused (CONSENT_DENIED)")
            assert not (notes / "n.txt").exists()

            # approved -> written
            approved = asyncio.ensure_future(client.call_tool("t__write_note", {"path": "n.txt", "text": "yes"}))
            card = await rig.wait_event(EventType.PERMISSION_REQUEST, 2)
            await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": card.data["request_id"], "decision": "allow"})
            result = await approved
            assert not result.is_error and (notes / "n.txt").read_text() == "yes"

            # a tool the grant does not allow is refused even though the server offers it
            refused = await client.call_tool("t__delete_note", {"path": "n.txt"})
            assert refused.is_error and refused.content[0].text.startswith("refused (")
            assert (notes / "n.txt").exists()
            unknown = await client.call_tool("nope__nothing", {})
            assert unknown.is_error and "UNKNOWN_TOOL" in unknown.content[0].text

        audit = [json.loads(line) for line in rig.audit_text().splitlines() if line.strip()]
        gateway_calls = [r for r in audit if str(r.get("call_id") or "").startswith("mcpgw_")]
        assert {r["tool"] for r in gateway_calls} >= {"t__echo", "t__write_note", "t__delete_note"}
        assert any(r["tool"] == "t__write_note" and r["decision"] == "deny" for r in gateway_calls)
        everything = caplog.text + rig.audit_text() + json.dumps([e.data for e in rig.broker.store.events_since(0)])
        assert session.token not in everything and session.token[10:30] not in everything


async def test_no_wrong_revoked_url_and_cross_origin_tokens_are_refused(tmp_path: Path, notes: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with asyncio.timeout(60), Rig(tmp_path, notes) as rig:
        session = await rig.gateway.session(KERNEL.origin, originator=KERNEL.client_id)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        good = {"Authorization": f"Bearer {session.token}", "Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=10) as http:
            ok = await http.post(session.url, json=body, headers=good)
            assert ok.status_code == 200 and len(ok.json()["result"]["tools"]) == 2
            none = await http.post(session.url, json=body)
            wrong = await http.post(session.url, json=body, headers={"Authorization": "Bearer relay-mcp-nope"})
            cookie = await http.post(session.url, json=body, headers={"Cookie": f"token={session.token}"})
            assert none.status_code == wrong.status_code == cookie.status_code == 401
            assert none.content == wrong.content == cookie.content and session.token not in wrong.text
            assert none.headers["WWW-Authenticate"] == 'Bearer realm="relay"'
            in_url = await http.post(session.url + f"?token={session.token}", json=body)
            assert in_url.status_code == 400 and session.token not in in_url.text
            foreign = await http.post(session.url, json=body, headers={**good, "Origin": "https://evil.example"})
            assert foreign.status_code == 403
            local_page = await http.post(session.url, json=body, headers={**good, "Origin": "http://127.0.0.1:8888"})
            assert local_page.status_code == 200
            assert (await http.get(session.url, headers=good)).status_code == 405
            bad_version = await http.post(session.url, json=body, headers={**good, "MCP-Protocol-Version": "2024-11-05"})
            assert bad_version.status_code == 400
            batch = await http.post(session.url, json=[body], headers=good)
            assert batch.status_code == 400
            discover = await http.post(session.url, headers=good,
                                       json={"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {}})
            assert discover.json()["error"]["code"] == -32601
            note = await http.post(session.url, headers=good,
                                   json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert note.status_code == 202
            assert rig.gateway.end(session) is True
            revoked = await http.post(session.url, json=body, headers=good)
            assert revoked.status_code == 401
        # the server side (relay's and tornado's loggers) never logged it; the client's own httpx2 log has the URL
        server_side = [r.getMessage() for r in caplog.records if r.name.startswith(("relay_jupyter", "tornado"))]
        assert server_side and not any(session.token in line for line in server_side)


async def test_an_origin_without_a_grant_is_offered_nothing_and_refused(tmp_path: Path, notes: Path) -> None:
    async with asyncio.timeout(60), Rig(tmp_path, notes) as rig:
        session = await rig.gateway.session(OTHER.origin, originator=OTHER.client_id)
        async with _client(session.url, session.token) as client:
            assert (await client.list_tools()).tools == []
            refused = await client.call_tool("t__echo", {"text": "x"})
            assert refused.is_error and refused.content[0].text.startswith("refused (")
        # a session of one origin never reaches another's grant
        assert rig.events(EventType.PERMISSION_REQUEST) == []


async def test_an_old_protocol_client_negotiates_a_version_the_gateway_speaks(tmp_path: Path, notes: Path) -> None:
    async with asyncio.timeout(60), Rig(tmp_path, notes) as rig:
        session = await rig.gateway.session(KERNEL.origin)
        headers = {"Authorization": f"Bearer {session.token}"}
        async with httpx2.AsyncClient(timeout=10) as http:
            for asked, got in (("2025-03-26", "2025-03-26"), ("2025-06-18", "2025-06-18"),
                               ("2099-01-01", "2025-11-25")):
                answer = await http.post(session.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}})
                assert answer.json()["result"]["protocolVersion"] == got


async def test_a_cli_token_reaches_one_notebooks_grant_and_can_be_revoked(tmp_path: Path, notes: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``jupyter relay mcp-token --notebook PATH`` (another process, another day): only the digest is stored,
    0600; the outside client gets that notebook's grant, consent from the side panel; revoked -> 401."""
    import os
    import stat

    from relay_jupyter.broker.mcp_gateway import tokens_file
    from relay_jupyter.cli import main

    data = tmp_path / "data"
    assert main(["mcp-token", "--notebook", "gw.ipynb", "--label", "claude", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    secret = next(word for line in out.splitlines() for word in line.split() if word.startswith("relay-mcp-"))
    assert 'claude mcp add --transport http relay' in out
    path = tokens_file(data)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and secret not in path.read_text()
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application

    from relay_jupyter.broker.mcp_gateway import GatewayHandler

    async with asyncio.timeout(60), Rig(tmp_path, notes) as rig:
        loopback = (await rig.gateway.session("notebook:unused.ipynb")).url  # starts the loopback listener
        # the gateway mounted as the Jupyter server mounts it ({base_url}relay/mcp: server/mcp_gateway.py)
        sockets = bind_sockets(0, "127.0.0.1")
        mount = HTTPServer(Application([(r"/relay/mcp", GatewayHandler, {"gateway": rig.gateway})]))
        mount.add_sockets(sockets)
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/relay/mcp"
        async with httpx2.AsyncClient(timeout=10) as http:
            # the loopback listener is for the broker's own subprocesses: a CLI token does not open it
            engines_only = await http.post(loopback, headers={"Authorization": f"Bearer {secret}"},
                                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert engines_only.status_code == 401
        async with _client(url, secret) as client:
            assert sorted(t.name for t in (await client.list_tools()).tools) == ["t__echo", "t__write_note"]
            pending = asyncio.ensure_future(client.call_tool("t__write_note", {"path": "cli.txt", "text": "x"}))
            card = await rig.wait_event(EventType.PERMISSION_REQUEST)
            assert card.origin == "notebook:gw.ipynb" and card.data.get("originator") is None
            browser = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me:default", user="me")
            await call_method(rig.broker, browser, "permission.answer",
                              {"request_id": card.data["request_id"], "decision": "deny"})
            assert (await pending).is_error and not (notes / "cli.txt").exists()
        assert main(["mcp-token", "--list", "--data-dir", str(data)]) == 0
        prefix = capsys.readouterr().out.split()[0]
        assert main(["mcp-token", "--revoke", prefix, "--data-dir", str(data)]) == 0
        async with httpx2.AsyncClient(timeout=10) as http:
            gone = await http.post(url, headers={"Authorization": f"Bearer {secret}"},
                                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert gone.status_code == 401
        from relay_jupyter.broker.mcp_gateway import mint_token

        second = mint_token(path, "notebook:gw.ipynb")
        assert rig.gateway.authenticate(second) is not None
        os.chmod(path, 0o644)  # a token file others can read is not trusted
        assert rig.gateway.authenticate(second) is None
        mount.stop()
    assert main(["mcp-token", "--data-dir", str(data)]) == 2  # --notebook missing: one line, exit 2
    assert main(["mcp-token", "--notebook", "../x.ipynb", "--data-dir", str(data)]) == 2
