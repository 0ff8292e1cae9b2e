"""Streamable HTTP: the registry against the test MCP server on 127.0.0.1, flood and hang over HTTP,
and the endpoint policy enforced per request inside the transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from relay_jupyter.mcp import McpRegistry, McpToolError
from relay_jupyter.mcp.config import HttpServerConfig, McpConfig
from relay_jupyter.mcp.http import HttpTransport
from relay_jupyter.testing.mcp_server import McpHttpServer


@pytest.fixture
def http_server(notes: Path) -> Iterator[McpHttpServer]:
    with McpHttpServer(notes) as server:
        yield server


def _registry(url: str, **kw: object) -> McpRegistry:
    cfg = HttpServerConfig(name="h", url=url, headers={"Authorization": "Bearer test-token"})
    return McpRegistry(McpConfig(servers={"h": cfg}), **kw)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_http_calls_flood_and_hang(http_server: McpHttpServer, notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(http_server.url, max_message_bytes=200_000, max_output_bytes=1000) as reg:
            status = reg.status()[0]
            assert status.state == "connected" and status.protocol_version == "2026-07-28"
            assert (await reg.call("h__echo", {"text": "hi"}))["content"] == "hi"
            out = await reg.call("h__flood", {"n_bytes": 50_000})
            assert out["truncated"] is True and "[output truncated:" in out["content"]
            with pytest.raises(McpToolError) as info:
                await reg.call("h__flood", {"n_bytes": 1_000_000})
            assert info.value.reason == "flood" and "larger than 200000 bytes" in info.value.message
            assert (await reg.call("h__echo", {"text": "again"}))["content"] == "again"
            with pytest.raises(McpToolError) as info:
                await reg.call("h__hang", {"seconds": 30}, timeout=0.5)
            assert info.value.reason == "timeout"
            assert (await reg.call("h__write_note", {"path": "n.txt", "text": "x"}))["is_error"] is False
            assert (notes / "n.txt").read_text() == "x"


@pytest.mark.asyncio
async def test_unreachable_http_server_fails_clearly() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    async with asyncio.timeout(30):
        async with _registry(f"http://127.0.0.1:{port}/mcp", connect_timeout=5) as reg:
            status = reg.status()[0]
            assert status.state == "failed" and "could not be reached" in status.error
            assert "test-token" not in status.error


@pytest.mark.asyncio
async def test_transport_enforces_policy_per_request() -> None:
    transport = HttpTransport(HttpServerConfig(name="h", url="http://127.0.0.1:9/mcp",
                                               headers={"Authorization": "Bearer test-token"}),
                              max_message_bytes=1000)
    async with transport._client as client:
        for url in ("http://evil.com/mcp", "https://user:pw@example.com/x", "https://example.com/?token=x"):
            with pytest.raises(httpx2.UnsupportedProtocol) as info:
                await client.post(url, content=b"{}")
            assert "test-token" not in str(info.value)
