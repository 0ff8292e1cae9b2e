"""A 401 / 403 from a Streamable HTTP MCP server reaches the user as "needs authorisation", with one hint.

The server is a hand-written Streamable HTTP MCP server (stdlib ``http.server`` on 127.0.0.1, JSON
answers, protocol 2025-06-18) that checks ``Authorization`` against a token the test can change: no
token, a wrong one, one revoked mid-session, a forbidden one (403). Header values never appear in a message.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from relay_jupyter.mcp import McpRegistry, McpToolError
from relay_jupyter.mcp.config import HttpServerConfig, McpConfig
from relay_jupyter.mcp.connection import McpConnection

GOOD = "Bearer good-token-5e1f"
TOOLS = [{"name": "echo", "description": "Echo.", "inputSchema": {"type": "object", "properties": {
    "text": {"type": "string"}}}}]


class AuthServer:
    def __init__(self) -> None:
        self.accepted = {GOOD}
        self.forbidden: set[str] = set()
        self.challenge = 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self, status: int) -> None:
                self.send_response(status)
                if status == 401 and outer.challenge:
                    self.send_header("WWW-Authenticate", outer.challenge)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802 - no standalone SSE stream
                self.send_response(405)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:  # noqa: N802
                self.do_GET()

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                token = self.headers.get("Authorization", "")
                if token in outer.forbidden:
                    return self._refuse(403)
                if token not in outer.accepted:
                    return self._refuse(401)
                if "id" not in body:
                    self.send_response(202)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                method = body.get("method")
                if method == "initialize":
                    result: Any = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                   "serverInfo": {"name": "auth", "version": "1"}}
                elif method == "tools/list":
                    result = {"tools": TOOLS}
                elif method == "tools/call":
                    result = {"content": [{"type": "text", "text": body["params"]["arguments"]["text"]}]}
                else:
                    data = json.dumps({"jsonrpc": "2.0", "id": body["id"],
                                       "error": {"code": -32601, "message": "Method not found"}}).encode()
                    return self._send(data)
                self._send(json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode())

            def _send(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Mcp-Session-Id", "s1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/mcp"

    def __enter__(self) -> AuthServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[AuthServer]:
    with AuthServer() as srv:
        yield srv


def conn(url: str, token: str | None) -> McpConnection:
    headers = {"Authorization": token} if token else {}
    return McpConnection(HttpServerConfig(name="remote", url=url, headers=headers), connect_timeout=10.0)


@pytest.mark.asyncio
async def test_no_token_needs_authorisation_not_unreachable(server: AuthServer) -> None:
    c = conn(server.url, None)
    with pytest.raises(McpToolError) as info:
        await c.open()
    assert info.value.reason == "auth"
    message = info.value.message
    assert "needs authorisation (HTTP 401)" in message and "could not be reached" not in message
    assert '"headers": {"Authorization": "Bearer …"}' in message
    assert "offers OAuth sign-in, which relay does not do yet" in message
    assert "\n" not in message


@pytest.mark.asyncio
async def test_a_refused_token_says_so_without_showing_it(server: AuthServer) -> None:
    server.challenge = ""  # a plain 401, no OAuth offered
    c = conn(server.url, "Bearer wrong-token-9c2a")
    with pytest.raises(McpToolError) as info:
        await c.open()
    assert info.value.reason == "auth"
    assert "the token in its mcp.json \"headers\" was refused: replace it" in info.value.message
    assert "wrong-token" not in info.value.message and "OAuth" not in info.value.message


@pytest.mark.asyncio
async def test_forbidden_is_a_403_line(server: AuthServer) -> None:
    server.forbidden.add("Bearer readonly-7")
    c = conn(server.url, "Bearer readonly-7")
    with pytest.raises(McpToolError) as info:
        await c.open()
    assert info.value.reason == "auth" and "refused access (HTTP 403)" in info.value.message
    assert "readonly-7" not in info.value.message


@pytest.mark.asyncio
async def test_a_token_revoked_mid_session_fails_the_call_as_authorisation(server: AuthServer) -> None:
    config = McpConfig(servers={"remote": HttpServerConfig(name="remote", url=server.url,
                                                           headers={"Authorization": GOOD})})
    async with McpRegistry(config, connect_timeout=10.0) as registry:
        assert registry.status()[0].state == "connected"
        assert (await registry.call("remote__echo", {"text": "hi"}))["content"] == "hi"
        server.accepted.clear()  # the token is revoked
        with pytest.raises(McpToolError) as info:
            await registry.call("remote__echo", {"text": "again"})
        assert info.value.reason == "auth" and "needs authorisation" in info.value.message
        status = registry.status()[0]
        assert GOOD.split()[1] not in json.dumps(status.as_dict())
