"""The registry against the shipped test MCP server over stdio: discovery, calls, namespacing,
classification and pins, and the misbehaving server (hang, death, flood) with no leaked process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from mcp_support import config_of, relay_test_server, wait_gone

from relay_jupyter.core.errors import Code, ConfigRefusal, Refusal
from relay_jupyter.core.types import ToolClass
from relay_jupyter.mcp import SUPPORTED_PROTOCOL_VERSIONS, McpRegistry, McpToolError
from relay_jupyter.mcp.config import StdioServerConfig, parse_config
from relay_jupyter.testing.mcp_server import INJECTION


def _registry(*servers: StdioServerConfig, store: object = None, **kw: object) -> McpRegistry:
    kw.setdefault("shutdown_grace", 0.5)
    return McpRegistry(config_of(*servers), store, **kw)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_discovery_namespacing_and_default_write(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("a", notes), relay_test_server("b", notes)) as reg:
            names = {s.name for s in reg.specs()}
            assert {"a__echo", "b__echo", "a__write_note", "a__hang", "b__flood"} <= names
            # Unpinned tools are write, even the ones annotated read_only (hints never widen).
            assert all(s.tool_class == ToolClass.WRITE for s in reg.specs())
            echo = reg.spec("a__echo")
            assert echo is not None and echo.hints["read_only_hint"] is True and echo.server == "a"
            assert echo.source.endswith(f"--dir {notes}")
            status = {s.name: s for s in reg.status()}
            assert status["a"].state == "connected" and status["a"].protocol_version in SUPPORTED_PROTOCOL_VERSIONS
            assert status["a"].tools == status["b"].tools > 5
            # Each server answers under its own prefix: no shadowing.
            out = await reg.call("b__echo", {"text": "hi"})
            assert out == {"content": "hi", "is_error": False, "structured": {"result": "hi"}, "truncated": False}
            failed = await reg.call("a__fail", {"message": "nope"})
            assert failed["is_error"] is True and "nope" in failed["content"]
            with pytest.raises(Refusal) as info:
                await reg.call("c__echo", {"text": "x"})
            assert info.value.code == Code.UNKNOWN_TOOL
            with pytest.raises(Refusal) as info:
                await reg.call("a__nope", {})
            assert info.value.code == Code.UNKNOWN_TOOL
            pid = reg._servers["a"].connection.pid
        assert pid is not None and wait_gone(pid), "stop() must leave no server process"


@pytest.mark.asyncio
async def test_injection_in_output_is_only_data(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes)) as reg:
            out = await reg.call("t__read_webpage", {"url": "https://example.com"})
            assert INJECTION in out["content"] and out["is_error"] is False
            # The write the injection asks for is still a write: consent is the gate's, not the model's.
            assert reg.spec("t__write_note").tool_class == ToolClass.WRITE
            assert not (notes / "pwned.txt").exists()


@pytest.mark.asyncio
async def test_output_capped_with_marker(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes), max_output_bytes=10_000) as reg:
            out = await reg.call("t__flood", {"n_bytes": 300_000})
            assert out["truncated"] is True and "[output truncated:" in out["content"]
            assert len(out["content"].encode()) < 10_200 and out["structured"] is None


@pytest.mark.asyncio
async def test_flood_kills_server_and_next_call_restarts_it(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes), max_message_bytes=256 * 1024) as reg:
            pid = reg._servers["t"].connection.pid
            with pytest.raises(McpToolError) as info:
                await reg.call("t__flood", {"n_bytes": 5_000_000})
            assert info.value.code == Code.TOOL_ERROR and info.value.reason == "flood"
            assert "larger than 262144 bytes" in info.value.message
            assert wait_gone(pid)
            assert (await reg.call("t__echo", {"text": "back"}))["content"] == "back"
            assert reg._servers["t"].connection.pid != pid


@pytest.mark.asyncio
async def test_hang_times_out_without_retry_or_leak(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes)) as reg:
            pid = reg._servers["t"].connection.pid
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(McpToolError) as info:
                await reg.call("t__hang", {"seconds": 60}, timeout=0.5)
            assert loop.time() - started < 5
            assert info.value.reason == "timeout" and "did not answer within 0.5 s" in info.value.message
            assert "not retried" in info.value.message
            assert wait_gone(pid), "a hung server is stopped, not leaked"
            assert reg.status()[0].state == "stopped"
            assert (await reg.call("t__add", {"a": 1, "b": 2}))["content"] == "3.0"


@pytest.mark.asyncio
async def test_per_server_timeout_from_config(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes, timeout=0.3)) as reg:
            with pytest.raises(McpToolError) as info:
                await reg.call("t__hang", {"seconds": 30})
            assert "within 0.3 s" in info.value.message


@pytest.mark.asyncio
async def test_server_dying_mid_call_is_a_clear_error(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes)) as reg:
            pid = reg._servers["t"].connection.pid
            call = asyncio.create_task(reg.call("t__hang", {"seconds": 60}, timeout=20))
            await asyncio.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(McpToolError) as info:
                await call
            assert info.value.reason == "exited" and "exit code -9" in info.value.message
            assert wait_gone(pid)


@pytest.mark.asyncio
async def test_broken_servers_fail_alone(notes: Path, tmp_path: Path) -> None:
    missing = StdioServerConfig(name="missing", command=str(tmp_path / "no-such-binary"))
    exits = StdioServerConfig(name="exits", command=sys.executable,
                              args=["-c", "import sys; sys.stderr.write('boom token=abc\\nplain line\\n'); sys.exit(3)"])
    noisy = StdioServerConfig(name="noisy", command=sys.executable,
                              args=["-c", ("import sys,time; sys.stdout.write('x' * 3_000_000); sys.stdout.flush(); "
                                           "time.sleep(60)")])
    reg = _registry(missing, exits, noisy, relay_test_server("ok", notes), max_message_bytes=1 << 20)
    async with asyncio.timeout(60):
        async with reg:
            status = {s.name: s for s in reg.status()}
            assert status["ok"].state == "connected", status["ok"].error
            assert "command not found" in status["missing"].error
            assert "exited with code 3" in status["exits"].error
            assert "plain line" in status["exits"].error and "abc" not in status["exits"].error
            assert "larger than 1048576 bytes" in status["noisy"].error
            assert all(s.server == "ok" for s in reg.specs())
            # A call to a failed server tries once to start it, then fails clearly.
            with pytest.raises(Refusal) as info:
                await reg.call("missing__x", {})
            assert info.value.code in (Code.TOOL_ERROR, Code.UNKNOWN_TOOL)
    for name in ("exits", "noisy"):
        pid = reg._servers[name].connection._transport.pid  # the pid check is the point
        assert wait_gone(pid), name


@pytest.mark.asyncio
async def test_silent_non_mcp_process_times_out_at_connect() -> None:
    garbage = StdioServerConfig(name="garbage", command=sys.executable,
                                args=["-c", "import time; print('hello, not json', flush=True); time.sleep(60)"])
    reg = _registry(garbage, connect_timeout=1.5)
    async with asyncio.timeout(30):
        async with reg:
            assert "handshake within 1.5 s" in reg.status()[0].error
    assert wait_gone(reg._servers["garbage"].connection._transport.pid)


@pytest.mark.asyncio
async def test_pins_classify_and_hints_only_tighten(notes: Path, store: object) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes), store=store) as reg:
            assert reg.pin("t__echo", "read").tool_class == ToolClass.READ
            assert reg.spec("t__echo").parallel_safe is True
            # A destructive hint beats a read pin; a lying read_only hint never makes a write a read.
            assert reg.pin("t__delete_note", "read").tool_class == ToolClass.WRITE
            assert reg.spec("t__mislabeled_write").tool_class == ToolClass.WRITE
            for bad in ("contained", "admin"):
                with pytest.raises(ConfigRefusal):
                    reg.pin("t__add", bad)
            with pytest.raises(Refusal) as info:
                reg.pin("t__nope", "read")
            assert info.value.code == Code.UNKNOWN_TOOL
            assert reg.unpin("t__delete_note") is True and reg.unpin("t__delete_note") is False
            assert [(p["server"], p["tool"]) for p in store.list_pins()] == [("t", "echo")]


@pytest.mark.asyncio
async def test_pin_dropped_when_command_line_changes(notes: Path, store: object) -> None:
    async with asyncio.timeout(40):
        async with _registry(relay_test_server("t", notes), store=store) as reg:
            reg.pin("t__echo", "read")
            assert reg.spec("t__echo").tool_class == ToolClass.READ
        # Same server name, same tools, but a different command line: a different digest.
        other = notes / "other"
        other.mkdir()
        async with _registry(relay_test_server("t", other), store=store) as reg:
            assert reg.spec("t__echo").tool_class == ToolClass.WRITE
            assert store.get_pin("t", "echo") is None, "a stale pin is deleted, so the next call asks again"


@pytest.mark.asyncio
async def test_digest_change_between_approval_and_call_is_refused(notes: Path) -> None:
    async with asyncio.timeout(30):
        async with _registry(relay_test_server("t", notes)) as reg:
            approved = reg.spec("t__echo").digest
            assert (await reg.call("t__echo", {"text": "a"}, expected_digest=approved))["content"] == "a"
            with pytest.raises(Refusal) as info:
                await reg.call("t__echo", {"text": "a"}, expected_digest="0" * 64)
            assert info.value.code == Code.DIGEST_MISMATCH


def test_invalid_config_entries_show_in_status() -> None:
    cfg = parse_config('{"mcpServers": {"bad": {"url": "http://evil.com/mcp"}, "off": {"command": "x", '
                       '"disabled": true}}}')
    reg = McpRegistry(cfg)
    status = {s.name: s for s in reg.status()}
    assert status["bad"].state == "invalid" and "loopback" in status["bad"].error
    assert status["off"].state == "disabled"
    assert reg.specs() == []
