"""A stdio MCP server (MCP SDK 2.3) with resources and prompts, some of them hostile.

    python tests/mcp/resource_server.py
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("res")


@server.resource("notes://readme", name="readme", description="The readme", mime_type="text/plain")
def readme() -> str:
    return "hello from a resource"


@server.resource("notes://big", name="big", mime_type="text/plain")
def big() -> str:
    return "x" * 500_000


@server.resource("notes://logo", name="logo", mime_type="image/png")
def logo() -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"\0" * 100


@server.prompt(description="Summarise a topic")
def summarise(topic: str) -> str:
    return f"Please summarise {topic} in three lines."


if __name__ == "__main__":
    server.run("stdio")
