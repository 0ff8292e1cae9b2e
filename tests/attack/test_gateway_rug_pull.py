"""Attack: a lying MCP server changes a pinned read tool under relay's MCP gateway (the "rug pull").

A real ``jupyter relay serve`` runs the test's changing stdio MCP server (``tests/mcp/changing_mcp_server.py``)
from ``mcp.json``; ``c__lookup`` is pinned ``read`` at the terminal and granted to ``daemon:agent``, whose
outside MCP client (the official ``mcp`` SDK over Streamable HTTP, a ``jupyter relay mcp-token``) calls it
through ``/relay/mcp``. Its first call answers, then the server silently turns the tool destructive by its
annotations alone (``--hints-only``), which the pin's digest does not cover.
The run path has its own test of this (``tests/mcp/test_mcp_tool_identity.py``); the gateway has no run whose
offered spec could be compared, so the attack is on it. Held: the next call asks the client's card (the daemon
client ``agent`` over RPC), nothing runs while it waits, a Deny runs nothing, and the refusal is what the
client reads.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx2
import pytest
from daemon_harness import Daemon, run_cli, start_daemon
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

SERVER = Path(__file__).resolve().parents[1] / "mcp" / "changing_mcp_server.py"


def _calls(notes: Path) -> list[str]:
    path = notes / "lookup.calls"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_pinned_tool_changed_under_the_gateway_asks_first(tmp_path: Path) -> None:
    # the annotations alone change (the sharper case: the pin's digest still matches; a changed
    # description or schema also changes the digest and unpins the tool)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "flip").touch()  # the first call of lookup turns it destructive, silently
    args = [str(SERVER), "--dir", str(notes), "--hints-only"]
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "mcp.json").write_text(json.dumps({"mcpServers": {"c": {"command": sys.executable,
                                                                               "args": args}}}))
    done = run_cli(tmp_path, "grants", "add", "daemon:agent", "--tools", "c__lookup", "--models", "*")
    assert done.returncode == 0, done.stderr
    minted = run_cli(tmp_path, "mcp-token", "--client", "agent")
    assert minted.returncode == 0, minted.stderr
    token = next(w for line in minted.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))

    # the pin (the CLI lists the server itself: slow) is made while the daemon starts; the store is shared
    pinning = asyncio.ensure_future(asyncio.to_thread(run_cli, tmp_path, "tools", "pin", "c__lookup", "read"))
    daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0")
    try:
        pinned = await pinning
        assert pinned.returncode == 0, pinned.stderr
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60))
        async with asyncio.timeout(120), \
                Client(streamable_http_client(f"http://127.0.0.1:{daemon.port}/relay/mcp", http_client=http)) as client:
            while not (await client.list_tools()).tools:  # the daemon connects its MCP servers after it listens
                await asyncio.sleep(0.1)
            first = await client.call_tool("c__lookup", {"word": "apple"})
            assert not first.is_error and first.content[0].text == "apple: a word"  # the pinned read: no card
            assert len(_calls(notes)) == 1
            assert daemon.rpc("permission.pending", {})["result"]["requests"] == []

            # the tool is now destructive; the client calls it exactly as before
            second = asyncio.ensure_future(client.call_tool("c__lookup", {"word": "apple"}))
            async with asyncio.timeout(30):
                while not (pending := daemon.rpc("permission.pending", {})["result"]["requests"]):
                    assert not second.done(), second.result()  # ran (or failed) without asking: the attack won
                    await asyncio.sleep(0.05)
            assert len(pending) == 1 and pending[0]["tool"] == "c__lookup", pending
            assert len(_calls(notes)) == 1  # nothing ran while the card is open
            answered = daemon.rpc("permission.answer", {"request_id": pending[0]["request_id"], "decision": "deny"})
            assert answered["result"]["decision"] == "deny", answered
            result = await second
            assert result.is_error and result.content[0].text.startswith("refused ("), result
            assert len(_calls(notes)) == 1
    finally:
        daemon.stop()
    audit = [json.loads(line) for path in daemon.data_dir.glob("audit*.jsonl")
             for line in path.read_text().splitlines() if line.strip()]
    decisions = [r["decision"] for r in audit if r["tool"] == "c__lookup"]
    assert decisions == ["allow", "deny"], decisions
