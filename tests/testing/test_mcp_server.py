"""The test MCP server driven by the official mcp.Client: in-process, over stdio, over Streamable HTTP."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import mcp
import pytest
from mcp import StdioServerParameters

from relay_jupyter.testing.mcp_server import FIXED_TIME, INJECTION, McpHttpServer, main, make_server

EXPECTED = {"echo", "add", "get_time_fixed", "stats", "write_note", "delete_note", "mislabeled_write",
            "flood", "hang", "read_webpage", "fail"}


def text_of(result) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


async def exercise(client: mcp.Client, notes) -> None:
    """What every transport must show: tools with snake_case annotations, a read and a write call."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) - {"die"} == EXPECTED
    assert tools["echo"].annotations.read_only_hint is True
    assert tools["write_note"].annotations.read_only_hint is False
    assert tools["delete_note"].annotations.destructive_hint is True
    assert tools["mislabeled_write"].annotations.read_only_hint is True  # the lie, on purpose
    echoed = await client.call_tool("echo", {"text": "h\u00e9llo"})
    assert not echoed.is_error and text_of(echoed) == "h\u00e9llo"
    wrote = await client.call_tool("write_note", {"path": "sub/a.txt", "text": "note body"})
    assert not wrote.is_error, text_of(wrote)
    assert (notes / "sub" / "a.txt").read_text() == "note body"


@pytest.mark.asyncio
async def test_in_process_tools(tmp_path):
    async with mcp.Client(make_server(tmp_path)) as c:
        await exercise(c, tmp_path)
        assert text_of(await c.call_tool("get_time_fixed", {})) == FIXED_TIME
        assert text_of(await c.call_tool("add", {"a": 2, "b": 3.5})) == "5.5"
        stats = await c.call_tool("stats", {"values": [1, 2, 3]})
        assert stats.structured_content == {"count": 3, "sum": 6.0, "mean": 2.0}
        assert INJECTION in text_of(await c.call_tool("read_webpage", {"url": "http://x"}))
        assert len(text_of(await c.call_tool("flood", {"n_bytes": 100_000}))) == 100_000
        failed = await c.call_tool("fail", {"message": "boom"})
        assert failed.is_error and "boom" in text_of(failed)
        deleted = await c.call_tool("delete_note", {"path": "sub/a.txt"})
        assert not deleted.is_error and not (tmp_path / "sub" / "a.txt").exists()
        bad_args = await c.call_tool("add", {"a": "not a number"})
        assert bad_args.is_error


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x", "", "link/x.txt", "nul\x00.txt"])
async def test_write_tools_refuse_escapes(tmp_path, path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "link").symlink_to(tmp_path)
    async with mcp.Client(make_server(notes)) as c:
        result = await c.call_tool("write_note", {"path": path, "text": "x"})
    assert result.is_error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


@pytest.mark.asyncio
async def test_write_without_directory_is_a_tool_error(monkeypatch):
    monkeypatch.delenv("RELAY_TEST_MCP_DIR", raising=False)
    async with mcp.Client(make_server()) as c:
        result = await c.call_tool("write_note", {"path": "a.txt", "text": "x"})
    assert result.is_error and "RELAY_TEST_MCP_DIR" in text_of(result)


@pytest.mark.asyncio
async def test_hang_is_cancellable(tmp_path):
    async with mcp.Client(make_server(tmp_path)) as c:
        with anyio.move_on_after(0.3) as scope:
            await c.call_tool("hang", {"seconds": 30})
        assert scope.cancelled_caught
        assert text_of(await c.call_tool("hang", {"seconds": 0})) == "slept 0.0 s"


@pytest.mark.asyncio
async def test_stdio(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "relay_jupyter.testing.mcp_server"],
                                   env={**os.environ, "RELAY_TEST_MCP_DIR": str(tmp_path)})
    with anyio.fail_after(20):
        async with mcp.Client(params) as c:
            await exercise(c, tmp_path)


@pytest.mark.asyncio
async def test_stdio_server_that_dies_mid_call(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "relay_jupyter.testing.mcp_server"],
                                   env={**os.environ, "RELAY_TEST_MCP_DIR": str(tmp_path)})
    with anyio.fail_after(20), pytest.RaisesGroup(mcp.MCPError, flatten_subgroups=True):
        async with mcp.Client(params) as c:
            assert "die" in {t.name for t in (await c.list_tools()).tools}
            await c.call_tool("die", {"code": 3})  # the SDK reports "Connection closed"


@pytest.mark.asyncio
async def test_in_process_server_has_no_die_tool(tmp_path):
    async with mcp.Client(make_server(tmp_path)) as c:
        assert "die" not in {t.name for t in (await c.list_tools()).tools}


@pytest.mark.asyncio
async def test_streamable_http_in_thread(tmp_path):
    with McpHttpServer(tmp_path) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        with anyio.fail_after(20):
            async with mcp.Client(srv.url) as c:
                await exercise(c, tmp_path)


def start_http_subprocess(directory) -> subprocess.Popen:
    """``--http 0`` in a child process; its first stdout line names the URL."""
    return subprocess.Popen(
        [sys.executable, "-m", "relay_jupyter.testing.mcp_server", "--http", "0", "--dir", str(directory)],
        stdout=subprocess.PIPE, text=True,
    )


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def first_line(proc: subprocess.Popen) -> str:
    return proc.stdout.readline().strip()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_streamable_http_subprocess_port_zero(tmp_path):
    proc = start_http_subprocess(tmp_path)
    try:
        line = first_line(proc)
        assert line.startswith("RELAY_TEST_MCP_URL=http://127.0.0.1:")
        url = line.split("=", 1)[1]
        with anyio.fail_after(20):
            async with mcp.Client(url) as c:
                await exercise(c, tmp_path)
    finally:
        stop_process(proc)


def test_cli_rejects_bad_port(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--http", "70000"])
    assert info.value.code == 2 and "PORT" in capsys.readouterr().err
