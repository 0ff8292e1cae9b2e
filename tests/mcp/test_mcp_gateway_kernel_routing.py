"""How the gateway routes an outside client's kernel tools (broker/mcp_gateway.py ``_notebook_kernel``,
broker/kernel_bridge.py ``live_only``): a real broker (SQLite store, gate, permission router, audit), the
gateway's JSON-RPC surface, and kernel event streams as the broker sees them (``EventBus.subscribe`` of kernel
callers: what the events endpoint does for each kernel's stream). The real kernel end to end is
``test_mcp_gateway_kernel.py``; this one attacks the routing rules an attacker would go for: a second kernel of
the notebook, another notebook's kernel, a kernel that connects later (replay), a forged answer, and a second
kernel attaching while a ``run_code`` card waits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.mcp_gateway import mcp_gateway_of
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Code, RoutingRefusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import EventType

ORIGIN = "notebook:k.ipynb"
K1 = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:k1")
K2 = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:k2")
ELSEWHERE = Caller(kind=CallerKind.KERNEL, origin="notebook:other.ipynb", client_id="kernel:o1")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me:default", user="me")


def _rpc(msg_id: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}).encode()


def _requests(sub: Any) -> list[dict[str, Any]]:
    """The kernel.tool_request events a subscription holds (drained), as its stream would send them."""
    out = []
    for event_id, frame in sub.drain():
        text = frame.decode()
        if "event: kernel.tool_request" in text:
            data = json.loads(text.split("data: ", 1)[1])
            out.append({"sse_id": event_id, **data})
    return out


async def _until(check: Any) -> Any:
    async with asyncio.timeout(30):
        while not (found := check()):
            await asyncio.sleep(0.01)
    return found


async def test_kernel_tools_go_only_to_the_notebooks_one_live_kernel(tmp_path: Path) -> None:
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", consent_timeout=30, kernel_tool_timeout=20))
    gateway = mcp_gateway_of(broker)
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"list_variables", "run_code", "propose_cell"}),
                              models=frozenset({"*"}), consent_id="c"))
    session = await gateway.session(ORIGIN, label="outside")  # no originator, no run: an outside client
    bus = broker.events

    async def names() -> list[str]:
        status, body = await gateway.handle(session, _rpc(1, "tools/list", {}))
        assert status == 200 and body is not None
        return sorted(t["name"] for t in json.loads(body)["result"]["tools"])

    async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        status, body = await gateway.handle(session, _rpc(2, "tools/call", {"name": name, "arguments": arguments}))
        assert status == 200 and body is not None
        return json.loads(body)["result"]

    try:
        elsewhere = bus.subscribe(ELSEWHERE, maxsize=1000)
        assert await names() == []  # another notebook's live kernel is not this notebook's
        one = bus.subscribe(K1, maxsize=1000)
        assert await names() == ["list_variables", "run_code"]  # no propose_cell: no running cell
        two = bus.subscribe(K2, maxsize=1000)
        assert await names() == []  # two kernels of the notebook: a request could not name one of them
        refused = await call("list_variables", {})
        assert refused["isError"] and "UNKNOWN_TOOL" in refused["content"][0]["text"]
        bus.unsubscribe(two)

        pending = asyncio.ensure_future(call("list_variables", {}))
        [request] = await _until(lambda: _requests(one))
        assert request["type"] == EventType.KERNEL_TOOL_REQUEST and request["data"]["client_id"] == K1.client_id
        assert request["sse_id"] is None and request["id"] is None and request["data"]["stored"] is False
        assert request["run_id"] is None
        assert _requests(elsewhere) == []
        # never stored: a kernel connecting later (or reconnecting) cannot replay it and run it
        assert [e for e in broker.store.events_since(0) if e.type == EventType.KERNEL_TOOL_REQUEST] == []
        request_id = request["data"]["request_id"]
        with pytest.raises(RoutingRefusal) as forged:  # the other kernel of the notebook cannot answer it
            broker.kernel_bridge.deliver(K2, request_id, "forged", False)
        assert forged.value.code is Code.NOT_ORIGINATOR
        broker.kernel_bridge.deliver(K1, request_id, "df: DataFrame", False)
        result = await pending
        assert not result["isError"] and result["content"][0]["text"] == "df: DataFrame"

        # run_code waits for the side panel; a second kernel attaching meanwhile gets nothing, nor does the first
        pending = asyncio.ensure_future(call("run_code", {"code": "x = 1"}))
        card = await _until(lambda: next(iter(broker.permissions.pending_for(BROWSER)), None))
        assert card.payload["tool"] == "run_code" and card.payload.get("originator") is None
        with pytest.raises(RoutingRefusal):  # the kernel that would run it cannot approve its own code
            await call_method(broker, K1, "permission.answer", {"request_id": card.payload["request_id"],
                                                                "decision": "allow"})
        two = bus.subscribe(K2, maxsize=1000)
        await call_method(broker, BROWSER, "permission.answer", {"request_id": card.payload["request_id"],
                                                                 "decision": "allow"})
        result = await pending
        assert result["isError"] and "no longer the one kernel attached" in result["content"][0]["text"]
        assert _requests(one) == [] and _requests(two) == []
        audit = (tmp_path / "data" / "audit.jsonl").read_text()
        assert session.token not in audit
        records = [json.loads(line) for line in audit.splitlines() if line.strip()]
        assert {r["tool"] for r in records if str(r.get("call_id", "")).startswith("mcpgw_")} >= {"list_variables",
                                                                                                 "run_code"}
    finally:
        await gateway.aclose()
        broker.close()
