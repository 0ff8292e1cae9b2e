"""Elicitation through a real run: the model calls an MCP tool, the server asks, the notebook's kernel answers.

A real broker (SQLite store, gate, PermissionRouter, runtime, the shipped fake Anthropic server) and a
real stdio MCP server (``elicit_server.py``, MCP SDK 2.3). The question reaches the run's origin with
the run's originator, only that kernel may answer, and the answer reaches the server and so the model.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.elicitations import router_of
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp.config import McpConfig, StdioServerConfig
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

pytestmark = pytest.mark.asyncio

KEY = "sk-test-elicit-0123456789"
KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:el.ipynb", client_id="kernel:elk")
OTHER = Caller(kind=CallerKind.KERNEL, origin="notebook:other.ipynb", client_id="kernel:oth")
SERVER = Path(__file__).with_name("elicit_server.py")


@pytest.fixture
def fake():
    with FakeAnthropic() as server:
        yield server


class Rig:
    def __init__(self, tmp_path: Path, fake: FakeAnthropic, server: StdioServerConfig | None = None) -> None:
        self.fake = fake
        self.broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", default_model="claude-test-1",
                                               consent_timeout=60))
        for caller in (KERNEL, OTHER):
            self.broker.grants.issue(Grant(origin=caller.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                           consent_id="c"))
        cfg = server or StdioServerConfig(name="el", command=sys.executable, args=[str(SERVER)])
        self.registry = McpRegistry(McpConfig(servers={cfg.name: cfg}), self.broker.store, shutdown_grace=0.5)
        self.broker.mcp = self.registry
        router_of(self.broker)  # what broker/assembly.py does at start
        retry = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.1, max_total_wait=0.1)
        install_runtime(self.broker, {"anthropic": AnthropicBackend(KEY, base_url=fake.base_url,
                                                                    models=("claude-*",), retry=retry, timeout=20)})

    async def __aenter__(self) -> Rig:
        await self.registry.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.broker.runs is not None:
            await self.broker.runs.aclose()
        await self.registry.stop()
        self.broker.close()

    def events(self, type: str | None = None) -> list[Any]:
        return [e for e in self.broker.store.events_since(0) if type is None or e.type == type]

    async def wait_event(self, type: str, n: int = 1) -> Any:
        async with asyncio.timeout(60):
            while len(self.events(type)) < n:
                await asyncio.sleep(0.02)
        return self.events(type)[n - 1]


async def test_the_server_asks_the_notebook_that_ran_the_tool(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(tool_use("el__ask_name", {})), Reply("done"))
    async with Rig(tmp_path, fake) as rig:
        run_id = (await call_method(rig.broker, KERNEL, "run.start", {"conversation": "c", "prompt": "hi",
                                                                       "mode": "full"}))["run_id"]
        # full mode asks no permission; the server's question is still asked: nothing accepts on its own
        event = await rig.wait_event(EventType.ELICITATION_REQUEST)
        data = event.data
        assert (event.origin, event.run_id) == (KERNEL.origin, run_id)
        assert (data["originator"], data["server"], data["tool"], data["from"]) == (
            KERNEL.client_id, "el", "el__ask_name", "server")
        with pytest.raises(Refusal) as info:
            await call_method(rig.broker, OTHER, "elicitation.answer",
                              {"request_id": data["request_id"], "action": "accept", "content": {"name": "Eve"}})
        assert info.value.code.value == "NOT_ORIGINATOR"
        await call_method(rig.broker, KERNEL, "elicitation.answer",
                          {"request_id": data["request_id"], "action": "accept", "content": {"name": "Ada"}})
        async with asyncio.timeout(60):
            await rig.broker.runs.wait(run_id)
        assert [e.type for e in rig.events() if e.run_id == run_id and e.type in TERMINAL_EVENTS] == [EventType.DONE]
    # the model got the tool's answer, built from the user's reply
    second = json.dumps(fake.requests[1].body["messages"])
    assert "accepted: Ada (30)" in second


async def test_a_kill_declines_the_open_question(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(tool_use("el__ask_name", {})), Reply("done"))
    async with Rig(tmp_path, fake) as rig:
        run_id = (await call_method(rig.broker, KERNEL, "run.start", {"conversation": "c", "prompt": "hi",
                                                                       "mode": "full"}))["run_id"]
        data = (await rig.wait_event(EventType.ELICITATION_REQUEST)).data
        assert router_of(rig.broker).decline_all(KERNEL.origin) == 1
        async with asyncio.timeout(60):
            await rig.broker.runs.wait(run_id)
        resolved = rig.events(EventType.ELICITATION_RESOLVED)
        assert [(e.data["request_id"], e.data["action"], e.data["answered_by"]) for e in resolved] == [
            (data["request_id"], "decline", "kill")]
    assert "answer: decline" in json.dumps(fake.requests[1].body["messages"])


RAW = StdioServerConfig(name="raw", command=sys.executable,
                        args=[str(Path(__file__).with_name("raw_mcp_server.py")), "--version", "2025-06-18"])


@pytest.mark.parametrize("how", ["kill", "kernel restart"])
async def test_kill_and_a_kernel_restart_decline_a_2025_06_18_servers_open_question(
        tmp_path: Path, fake: FakeAnthropic, how: str) -> None:
    """At 2025-06-18 the question is a request of its own (it is not cancelled with the call): the kill
    switch and the end of the kernel decline it explicitly, and the server gets decline."""
    from relay_jupyter.broker.kernel_bridge import end_kernel

    fake.enqueue(Reply(tool_use("raw__ask", {})), Reply("done"))
    async with Rig(tmp_path, fake, RAW) as rig:
        run_id = (await call_method(rig.broker, KERNEL, "run.start", {"conversation": "c", "prompt": "hi",
                                                                       "mode": "full"}))["run_id"]
        data = (await rig.wait_event(EventType.ELICITATION_REQUEST)).data
        if how == "kill":
            await call_method(rig.broker, KERNEL, "kill", {})
            expected = f"kill:{KERNEL.client_id}"
        else:
            end_kernel(rig.broker, KERNEL.client_id, "restarted")
            expected = "withdrawn:restarted"
        async with asyncio.timeout(60):
            await rig.broker.runs.wait(run_id)
        resolved = [e.data for e in rig.events(EventType.ELICITATION_RESOLVED)]
        assert [(d["request_id"], d["action"], d["answered_by"]) for d in resolved] == [
            (data["request_id"], "decline", expected)]
