"""The assembled broker: durable store, workspace, runtime and the MCP registry wired together by
broker.assembly, driven through the RPC method table with FakeAnthropic and the test MCP server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components, start_components, stop_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

KEY = "sk-ant-test-assembly-0123456789"
NB = Caller(kind=CallerKind.KERNEL, origin="notebook:analysis.ipynb", client_id="kernel:k1")


def make_broker(tmp_path: Path, **config) -> Broker:
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=20, **config))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              consent_id="test-click"))
    return broker


async def wait_terminal(broker: Broker, run_id: str) -> str:
    await asyncio.wait_for(broker.runs.wait(run_id), 30)
    return next(e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS)


async def answer_next_request(broker: Broker, decision: str) -> dict:
    async with asyncio.timeout(30):
        while True:
            requests = [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST]
            answered = {e.data["request_id"] for e in broker.store.events_since(0)
                        if e.type == EventType.PERMISSION_RESOLVED}
            open_ = [e for e in requests if e.data["request_id"] not in answered]
            if open_:
                request = open_[0].data
                await call_method(broker, NB, "permission.answer",
                                  {"request_id": request["request_id"], "decision": decision, "scope": "once"})
                return request
            await asyncio.sleep(0.02)


def test_no_configured_backend_installs_only_the_demo(tmp_path):
    broker = make_broker(tmp_path)
    install_components(broker, jupyter_root=tmp_path)
    try:
        assert set(broker.runs.backends) == {"demo"}
        assert broker.config.default_backend == "demo" and broker.config.default_model == "demo"
        assert broker.workspace_tools is not None and broker.checkpoints is not None
        assert broker.mcp is None  # no MCP server configured: no registry (and no MCP SDK import, issue 19)
    finally:
        broker.close()


def test_a_configured_key_never_installs_the_demo(tmp_path):
    broker = make_broker(tmp_path, anthropic_api_key=KEY)
    install_components(broker, jupyter_root=tmp_path)
    try:
        assert set(broker.runs.backends) == {"anthropic"} and broker.config.default_backend == "anthropic"
    finally:
        broker.close()


@pytest.mark.asyncio
@pytest.mark.slow
async def test_mcp_write_waits_for_the_originator_and_a_denial_leaves_nothing(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    broker = make_broker(tmp_path, mcp_config_path=mcp_json, default_model="claude-test-1")
    with FakeAnthropic(api_key=KEY) as fake:
        backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
        install_components(broker, jupyter_root=tmp_path, backends={"anthropic": backend})
        await start_components(broker)
        try:
            listed = await call_method(broker, NB, "tools.list", {})
            classes = {t["name"]: t["class"] for t in listed["tools"]}
            assert classes["notes__write_note"] == "write" and classes["scratch_edit"] == "contained"

            # approved: the file appears, and the model is told it worked
            fake.enqueue(Reply(tool_use("notes__write_note", {"path": "a.txt", "text": "hello"})),
                         Reply(text("done")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "write a note"})
            request = await answer_next_request(broker, "allow")
            assert request["tool"] == "notes__write_note" and request["originator"] == NB.client_id
            assert await wait_terminal(broker, run["run_id"]) == EventType.DONE
            assert (notes / "a.txt").read_text() == "hello"

            # denied: nothing is written and the denial reaches the model
            fake.enqueue(Reply(tool_use("notes__write_note", {"path": "b.txt", "text": "no"})),
                         Reply(text("understood")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "another"})
            await answer_next_request(broker, "deny")
            assert await wait_terminal(broker, run["run_id"]) == EventType.DONE
            assert not (notes / "b.txt").exists()
            last = json.dumps(fake.requests[-1].json["messages"][-1])
            assert "CONSENT_DENIED" in last or "denied" in last.lower()
            audit = await call_method(broker, NB, "audit.tail", {"n": 50})
            decisions = [(r["tool"], r["decision"]) for r in audit["records"] if r["tool"] == "notes__write_note"]
            assert ("notes__write_note", "deny") in decisions and ("notes__write_note", "allow") in decisions
        finally:
            await stop_components(broker)
            broker.close()
