"""Resources and prompts at the connection: listed, read and fetched within the same bounds as tool results.

(Offering them to runs as read tools waits for the tool seam of issue 14.1: docs/mcp.md.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relay_jupyter.mcp.config import StdioServerConfig
from relay_jupyter.mcp.connection import McpConnection, McpToolError

HERE = Path(__file__).parent


@pytest.mark.asyncio
async def test_resources_and_prompts_are_listed_read_and_bounded() -> None:
    conn = McpConnection(StdioServerConfig(name="res", command=sys.executable, args=[str(HERE / "resource_server.py")]),
                         connect_timeout=30.0, max_output_bytes=10_000)
    try:
        await conn.open()
        listed = {r["uri"]: r for r in await conn.list_resources()}
        assert set(listed) == {"notes://readme", "notes://big", "notes://logo"}
        assert listed["notes://readme"]["description"] == "The readme"
        assert await conn.read_resource("notes://readme") == {"content": "hello from a resource", "truncated": False}
        big = await conn.read_resource("notes://big")
        assert big["truncated"] and len(big["content"].encode()) < 10_200 and "[output truncated:" in big["content"]
        logo = await conn.read_resource("notes://logo")
        assert "binary resource notes://logo" in logo["content"] and "PNG" not in logo["content"]
        with pytest.raises(McpToolError) as info:
            await conn.read_resource("notes://missing")
        assert info.value.reason == "protocol"
        prompts = await conn.list_prompts()
        assert [(p["name"], [a["name"] for a in p["arguments"]]) for p in prompts] == [("summarise", ["topic"])]
        got = await conn.get_prompt("summarise", {"topic": "MCP"})
        assert got == {"messages": [{"role": "user", "text": "Please summarise MCP in three lines."}], "truncated": False}
        assert conn.connected  # a refused read leaves the connection up
    finally:
        await conn.close()


@pytest.mark.asyncio
async def test_a_server_without_resources_lists_none() -> None:
    conn = McpConnection(StdioServerConfig(name="el", command=sys.executable, args=[str(HERE / "elicit_server.py")]),
                         connect_timeout=30.0)
    try:
        await conn.open()
        assert await conn.list_resources() == [] and await conn.list_prompts() == []
    finally:
        await conn.close()
