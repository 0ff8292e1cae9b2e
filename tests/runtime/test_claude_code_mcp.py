"""MCP tools to Claude Code through the gate (issue 17 item 2): the claude-code engine gives the CLI relay's gated
MCP gateway (docs/mcp.md) as its only MCP server, with a token minted for the run; a CLI call of a tool
from relay's registry gets the gate's decision — a pinned read runs without a card, a write asks the run's
kernel (Deny: nothing written, the model reads the refusal; Approve: written), a tool outside the grant is
refused — each journalled and audited under the model's own ``tool_use`` id; the token is revoked when the run
ends.

The REAL bundled ``claude`` CLI against ``FakeAnthropic``, with the shipped test MCP server over stdio as the
user's server; ``peer``, only inside ``unshare -n``.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from relay_jupyter.broker.assembly import install_components, start_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.mcp_gateway import mcp_gateway_of
from relay_jupyter.core.types import Grant, ToolClass
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import Reply, tool_use

from .claude_code_rig import (KEY, MODEL, NB, ONLY_ISOLATED, answer, close, events, fake, result_text,
                              terminal, tool_results)

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


async def _broker(tmp_path, fake) -> Broker:
    root, notes = tmp_path / "root", tmp_path / "notes"
    root.mkdir()
    notes.mkdir()
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"t": {
        "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL, mcp_config_path=mcp,
                                      default_engine="claude-code"))
    # every tool but the test server's `hang`: the gateway offers the grant's tools only
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"t__echo", "t__write_note"}),
                              models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=root)
    await start_components(broker)
    async with asyncio.timeout(60):
        while "t__echo" not in json.dumps(await call_method(broker, NB, "tools.list", {})):
            await asyncio.sleep(0.1)
    broker.mcp.pin("t__echo", ToolClass.READ)
    return broker


async def _stop(broker: Broker) -> None:
    await close(broker)
    broker.close()


async def test_cli_mcp_calls_get_the_gates_decision(tmp_path, fake):
    broker = await _broker(tmp_path, fake)
    notes = tmp_path / "notes"
    try:
        fake.enqueue(Reply(tool_use("mcp__relay__t__echo", {"text": "hello through relay"}, id="toolu_echo"),
                           tool_use("mcp__relay__t__write_note", {"path": "denied.txt", "text": "no"}, id="toolu_no"),
                           tool_use("mcp__relay__t__hang", {"seconds": 1}, id="toolu_hang")),
                     Reply("Done with the tools."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "m", "prompt": "use the tools"}))[
            "run_id"]
        card = await answer(broker, "deny")
        assert card["tool"] == "t__write_note"  # the pinned read asked nothing; the write asked the run's kernel
        assert await terminal(broker, run_id) == EventType.DONE
        assert not (notes / "denied.txt").exists()
        results = {b["tool_use_id"]: b for b in tool_results(fake)}
        assert "hello through relay" in result_text(results["toolu_echo"])
        assert not results["toolu_echo"].get("is_error")
        assert results["toolu_no"].get("is_error") and "CONSENT_DENIED" in result_text(results["toolu_no"])
        assert results["toolu_hang"].get("is_error")  # not in the grant: not offered, and refused if called
        # audited under the model's own tool_use ids (the engine's hook announced each call to the gateway)
        audited = {(r.call_id, r.tool, r.decision) for r in broker.audit.tail(1000, origin=NB.origin)}
        assert {("toolu_echo", "t__echo", "allow"), ("toolu_no", "t__write_note", "deny")} <= audited
        assert not [r for r in broker.audit.tail(1000, origin=NB.origin) if (r.call_id or "").startswith("mcpgw_")]
        # the run's gateway token died with the run
        assert not mcp_gateway_of(broker)._sessions

        fake.enqueue(Reply(tool_use("mcp__relay__t__write_note", {"path": "approved.txt", "text": "yes"},
                                    id="toolu_yes")), Reply("Written."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "m", "prompt": "now write"}))["run_id"]
        await answer(broker, "allow")
        assert await terminal(broker, run_id) == EventType.DONE
        assert (notes / "approved.txt").read_text() == "yes"
        assert len(events(broker, run_id, EventType.PERMISSION_REQUEST)) == 1  # one card, not one per layer
        run = (await call_method(broker, NB, "runs.get", {"run_id": run_id}))["run"]
        assert [(c["call_id"], c["tool"]) for c in run["calls"]] == [("toolu_yes", "t__write_note")]
    finally:
        await _stop(broker)
