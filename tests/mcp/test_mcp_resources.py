"""Resources and prompts at the connection: listed, read and fetched within the same bounds as tool results;
resources offered to runs as read tools through the gate (docs/mcp.md)."""

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


@pytest.mark.asyncio
async def test_resources_are_offered_to_runs_as_read_tools_through_the_gate(tmp_path: Path) -> None:
    """``res__list_resources`` / ``res__read_resource``: offered by the registry for a server that announces
    resources, class ``read`` (no card), called through tools.call's executor and gate, bounded like a tool
    result; a missing resource is an error result, the connection stays up."""
    import asyncio

    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.broker.dispatch import call_method
    from relay_jupyter.core.caller import Caller, CallerKind
    from relay_jupyter.core.types import Grant, ToolClass
    from relay_jupyter.mcp import McpRegistry
    from relay_jupyter.mcp.config import McpConfig
    from relay_jupyter.protocol.names import EventType

    kernel = Caller(kind=CallerKind.KERNEL, origin="notebook:res.ipynb", client_id="kernel:res")
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", consent_timeout=30))
    cfg = StdioServerConfig(name="res", command=sys.executable, args=[str(HERE / "resource_server.py")])
    registry = McpRegistry(McpConfig(servers={"res": cfg}), broker.store, shutdown_grace=0.5, max_output_bytes=10_000)
    broker.mcp = registry
    broker.grants.issue(Grant(origin=kernel.origin, tools=frozenset({"res__list_resources", "res__read_resource"}),
                              models=frozenset({"*"}), consent_id="c"))
    try:
        async with asyncio.timeout(60):
            await registry.start()
            specs = {s.name: s for s in registry.specs()}
            assert specs["res__list_resources"].tool_class is ToolClass.READ
            assert specs["res__read_resource"].tool_class is ToolClass.READ
            listed = await call_method(broker, kernel, "tools.call", {"conversation": "c", "tool": "res__list_resources",
                                                                     "arguments": {}})
            assert "notes://readme" in listed["content"] and not listed["is_error"]
            read = await call_method(broker, kernel, "tools.call", {"conversation": "c", "tool": "res__read_resource",
                                                                   "arguments": {"uri": "notes://readme"}})
            assert read["content"] == "hello from a resource"
            big = await call_method(broker, kernel, "tools.call", {"conversation": "c", "tool": "res__read_resource",
                                                                  "arguments": {"uri": "notes://big"}})
            assert "[output truncated:" in big["content"] and len(big["content"].encode()) < 10_200
            missing = await call_method(broker, kernel, "tools.call", {"conversation": "c", "tool": "res__read_resource",
                                                                      "arguments": {"uri": "notes://missing"}})
            assert missing["is_error"]
            assert [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST] == []
            assert registry.status()[0].state == "connected"
    finally:
        await registry.stop()
        broker.close()


def test_a_server_tool_named_like_relays_resource_tools_keeps_its_own_class() -> None:
    from types import SimpleNamespace

    from relay_jupyter.core.types import ToolSpec
    from relay_jupyter.mcp.discovery import DiscoveredTool
    from relay_jupyter.mcp.registry import _resource_tools

    own = DiscoveredTool(spec=ToolSpec(name="s__read_resource", server="s"), remote_name="read_resource")
    added = _resource_tools("s", "cmd", SimpleNamespace(offers=lambda cap: True), [own])  # type: ignore[arg-type]
    assert [t.spec.name for t in added] == ["s__list_resources"]  # the server's own read_resource stays its own
    assert _resource_tools("s", "cmd", SimpleNamespace(offers=lambda cap: False), []) == []  # type: ignore[arg-type]
