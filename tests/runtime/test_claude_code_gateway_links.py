"""Without the CLI: which gateway sessions are offered kernel tools, and how a gateway call is linked to the model's
``tool_use`` id (``broker/gateway_links.py``). The real CLI's side is ``test_claude_code_kernel_tools.py``."""

from __future__ import annotations

import asyncio
import json

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.gateway_links import META_KEY, ProposedCalls
from relay_jupyter.broker.mcp_gateway import McpGateway
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.kernel_tools import KERNEL_TOOL_NAMES
from relay_jupyter.protocol.names import EventType

ORIGIN = "notebook:k.ipynb"
KERNEL = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:k1")


def test_a_call_is_linked_only_to_the_id_announced_for_that_same_call():
    calls = ProposedCalls()
    assert calls.expect("toolu_a", "run_code", {"code": "1"})
    assert calls.expect("toolu_b", "run_code", {"code": "2"})
    # _meta naming an announced id, but for other arguments (or another tool): not linked
    assert calls.claim("run_code", {"code": "3"}, {META_KEY: "toolu_a"}) is None
    assert calls.claim("list_variables", {"code": "1"}, {META_KEY: "toolu_a"}) is None
    assert calls.claim("run_code", {"code": "1"}, {META_KEY: "toolu_nobody"}) is None
    assert calls.claim("run_code", {"code": "1"}, {META_KEY: 7}) is None
    assert calls.claim("run_code", {"code": "1"}, {META_KEY: "toolu_a"}) == "toolu_a"
    assert calls.claim("run_code", {"code": "1"}, {META_KEY: "toolu_a"}) is None  # an id is taken once
    assert not calls.expect("toolu_a", "run_code", {"code": "1"})  # and never announced again
    # no _meta (another client): the oldest announced call with the same tool and arguments
    assert calls.expect("toolu_c", "run_code", {"code": "2"})
    assert calls.claim("run_code", {"code": "2"}, None) == "toolu_b"
    assert calls.claim("run_code", {"code": "2"}, {}) == "toolu_c"
    assert calls.claim("run_code", {"code": "2"}, None) is None
    for bad in (None, "", "x" * 129, "toolu a", "toolu_\n", 12):  # ids relay would not journal
        assert not calls.expect(bad, "run_code", {})
    for n in range(300):  # bounded: the oldest announcements go first
        calls.expect(f"toolu_{n}", "t", {"n": n})
    assert len(calls) == 256 and calls.claim("t", {"n": 0}, None) is None and calls.claim("t", {"n": 299}, None)


@pytest.mark.asyncio
async def test_only_an_engine_run_a_kernel_started_is_offered_that_kernels_tools(tmp_path):
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    gateway = McpGateway(broker)
    try:
        def names(session) -> set[str]:
            return {t["name"] for t in gateway.tools(session)}

        run = await gateway.session(ORIGIN, originator=KERNEL.client_id, run_id="run_1", caller_kind="kernel")
        assert set(KERNEL_TOOL_NAMES) <= names(run)
        # an outside client's token, a session without a kernel originator, a run the side panel started: none
        for session in (await gateway.session(ORIGIN),
                        await gateway.session(ORIGIN, originator=KERNEL.client_id, run_id="run_2"),
                        await gateway.session(ORIGIN, run_id="run_3", caller_kind="kernel"),
                        await gateway.session(ORIGIN, originator="browser:me", run_id="run_4", caller_kind="browser"),
                        await gateway.session(ORIGIN, originator="daemon:cli", run_id="run_5", caller_kind="daemon")):
            assert not set(KERNEL_TOOL_NAMES) & names(session), session
            answer = json.loads((await gateway.handle(session, json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "run_code", "arguments": {"code": "1"}}}).encode()))[1])
            assert answer["result"]["isError"] and "UNKNOWN_TOOL" in answer["result"]["content"][0]["text"]
        assert not broker.kernel_bridge.waiting  # nothing was asked of any kernel

        # the run's kernel is asked, under the id the engine announced for that call
        assert run.proposed.expect("toolu_vars", "list_variables", {})
        call = asyncio.ensure_future(gateway.handle(run, json.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "list_variables", "arguments": {}, "_meta": {META_KEY: "toolu_vars"}}}).encode()))
        async with asyncio.timeout(10):
            while not [e for e in broker.store.events_since(0) if e.type == EventType.KERNEL_TOOL_REQUEST]:
                await asyncio.sleep(0.01)
        (request,) = [e.data for e in broker.store.events_since(0) if e.type == EventType.KERNEL_TOOL_REQUEST]
        assert request["client_id"] == KERNEL.client_id and request["tool"] == "list_variables"
        broker.kernel_bridge.deliver(KERNEL, request["request_id"], "x: int", False)
        answer = json.loads((await call)[1])
        assert answer["result"]["content"][0]["text"] == "x: int" and not answer["result"]["isError"]
        proposed = [e.data["call_id"] for e in broker.store.events_since(0) if e.type == EventType.TOOL_PROPOSED]
        assert proposed[-1] == "toolu_vars"
        assert ("toolu_vars", "list_variables", "allow") in {(r.call_id, r.tool, r.decision)
                                                             for r in broker.audit.tail(100, origin=ORIGIN)}
        assert all(p.startswith("mcpgw_") for p in proposed[:-1])  # nothing announced: the gateway's own ids
    finally:
        await gateway.aclose()
        broker.close()


@pytest.mark.asyncio
async def test_a_runs_tools_selection_narrows_what_the_gateway_offers_and_runs(tmp_path):
    """``%%agent --engine claude-code --tools list_variables``: the run's gateway session offers and runs only the
    selected tools, as the relay engine's ``ToolIndex(allowed=)`` does; the others are ``UNKNOWN_TOOL``."""
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    gateway = McpGateway(broker)
    try:
        narrow = await gateway.session(ORIGIN, originator=KERNEL.client_id, run_id="run_n", caller_kind="kernel",
                                       allowed=["list_variables"])
        assert {t["name"] for t in gateway.tools(narrow)} == {"list_variables"}
        answer = json.loads((await gateway.handle(narrow, json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
             "params": {"name": "run_code", "arguments": {"code": "1"}}}).encode()))[1])
        assert answer["result"]["isError"] and "UNKNOWN_TOOL" in answer["result"]["content"][0]["text"]
        assert not broker.kernel_bridge.waiting
        wide = await gateway.session(ORIGIN, originator=KERNEL.client_id, run_id="run_w", caller_kind="kernel")
        assert {"list_variables", "run_code"} <= {t["name"] for t in gateway.tools(wide)}
    finally:
        await gateway.aclose()
        broker.close()
