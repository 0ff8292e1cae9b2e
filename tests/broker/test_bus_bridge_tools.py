"""EventBus visibility and bounded buffers; the kernel bridge's routing; tools.call through the gate."""

from __future__ import annotations

import asyncio

import pytest
from broker_callers import BROWSER, KERNEL_A, KERNEL_A2, KERNEL_B

from relay_jupyter.broker.events import can_see
from relay_jupyter.core.types import Event
from relay_jupyter.protocol.names import EventType


def test_visibility_rules():
    broadcast = Event(id=1, ts=0, type="x", origin=None)
    mine = Event(id=2, ts=0, type="x", origin=KERNEL_A.origin)
    assert can_see(KERNEL_B, broadcast) and can_see(KERNEL_A, mine) and can_see(KERNEL_A2, mine)
    assert not can_see(KERNEL_B, mine)
    assert can_see(BROWSER, mine)


@pytest.mark.asyncio
async def test_live_fanout_filters_and_overflow_frees_memory(broker):
    dropped = []
    sub_a = broker.events.subscribe(KERNEL_A, maxsize=10)
    sub_b = broker.events.subscribe(KERNEL_B, maxsize=3, on_overflow=lambda: dropped.append(True))
    broker.events.append("t", {"n": 1}, origin=KERNEL_A.origin)
    broker.events.append("t", {"n": 2})
    assert [i for i, _ in sub_a.drain()] == [1, 2]
    assert sub_b.pending == 1  # only the broadcast
    for n in range(5):
        broker.events.append("t", {"n": n})
    assert sub_b.overflowed and dropped == [True] and sub_b.pending == 0
    broker.events.append("t", {"n": 9})
    assert sub_b.pending == 0  # nothing buffered after overflow: memory stays bounded
    broker.events.unsubscribe(sub_b, "slow subscriber")
    assert broker.events.disconnects == {"slow subscriber": 1}


@pytest.mark.asyncio
async def test_replay_frames_are_filtered(broker):
    broker.events.append("t", {"n": 1}, origin=KERNEL_A.origin)
    broker.events.append("t", {"n": 2}, origin=KERNEL_B.origin)
    broker.events.append("t", {"n": 3})
    nxt, frames, done = broker.events.replay_frames(KERNEL_B, 0, limit=100)
    assert not done and nxt == 3
    assert frames.count(b"\nevent: ") == 2 and b'"n":1' not in frames
    assert broker.events.replay_frames(KERNEL_B, 3, limit=100)[2] is True


@pytest.mark.asyncio
async def test_kernel_bridge_routes_to_the_asking_kernel_only(broker, call):
    bridge = broker.kernel_bridge
    task = asyncio.create_task(bridge.call(KERNEL_A.origin, KERNEL_A.client_id, "list_variables", {}))
    async with asyncio.timeout(2):
        while not bridge.waiting:
            await asyncio.sleep(0)
    event = broker.store.events_since(0)[-1]
    assert event.type == EventType.KERNEL_TOOL_REQUEST and event.origin == KERNEL_A.origin
    rid = event.data["request_id"]
    for other in (KERNEL_B, KERNEL_A2):
        refused = await call(other, "kernel.tool_result", {"request_id": rid, "content": "evil"})
        assert refused["error"]["data"]["code"] == "NOT_ORIGINATOR"
    ok = await call(KERNEL_A, "kernel.tool_result", {"request_id": rid, "content": "x: int"})
    assert ok["result"] == {"ok": True}
    assert await task == {"content": "x: int", "is_error": False}
    again = await call(KERNEL_A, "kernel.tool_result", {"request_id": rid, "content": "twice"})
    assert again["error"]["data"]["code"] == "CONFLICT"


@pytest.mark.asyncio
async def test_kernel_bridge_timeout_is_an_error_result(broker):
    result = await broker.kernel_bridge.call(KERNEL_A.origin, KERNEL_A.client_id, "list_variables", {},
                                             timeout=0.01)
    assert result["is_error"] is True and "did not answer" in result["content"]


@pytest.mark.asyncio
async def test_tools_call_goes_through_the_gate(broker, call):
    # no grant -> UNAUTHORIZED, audited
    r = await call(KERNEL_A, "tools.call", {"conversation": "c", "tool": "list_variables"})
    assert r["error"]["data"]["code"] == "UNAUTHORIZED"
    await call(KERNEL_A, "grants.create", {"tools": ["list_variables"], "models": []})
    r = await call(KERNEL_A, "tools.call", {"conversation": "c", "tool": "run_code", "arguments": {"code": "1"}})
    assert r["error"]["data"]["code"] == "SCOPE_EXCEEDED"
    r = await call(KERNEL_A, "tools.call", {"conversation": "c", "tool": "describe_dataframe", "arguments": {}})
    assert r["error"]["data"]["code"] == "INVALID_ARGUMENTS"
    r = await call(KERNEL_A, "tools.call", {"conversation": "c", "tool": "nope"})
    assert r["error"]["data"]["code"] == "UNKNOWN_TOOL"
    # a granted read runs: the kernel bridge asks kernel A, which answers
    task = asyncio.create_task(call(KERNEL_A, "tools.call", {"conversation": "c", "tool": "list_variables"}))
    async with asyncio.timeout(2):
        while not broker.kernel_bridge.waiting:
            await asyncio.sleep(0)
    rid = broker.store.events_since(0)[-1].data["request_id"]
    broker.kernel_bridge.deliver(KERNEL_A, rid, "df: DataFrame", False)
    assert (await task)["result"] == {"content": "df: DataFrame", "is_error": False}
    decisions = [(a.tool, a.decision, a.code) for a in broker.audit.tail(10, origin=KERNEL_A.origin)]
    assert ("list_variables", "deny", "UNAUTHORIZED") in decisions
    assert ("run_code", "deny", "SCOPE_EXCEEDED") in decisions
    metrics = broker.metrics.render().decode()
    assert 'relay_decisions_total{code="SCOPE_EXCEEDED",decision="deny"} 1.0' in metrics


@pytest.mark.asyncio
async def test_tools_list_shows_classes_and_grant(broker, call):
    await call(KERNEL_A, "grants.create", {"tools": ["list_variables"]})
    tools = {t["name"]: t for t in (await call(KERNEL_A, "tools.list", {}))["result"]["tools"]}
    assert tools["list_variables"]["class"] == "read" and tools["list_variables"]["allowed"] is True
    assert tools["run_code"]["class"] == "write" and tools["run_code"]["allowed"] is False


@pytest.mark.asyncio
async def test_control_methods_stay_within_the_origin(broker, call):
    await call(KERNEL_A, "grants.create", {"tools": ["*"]})
    assert (await call(KERNEL_B, "grants.get", {}))["result"]["grant"] is None
    denied = await call(KERNEL_B, "grants.revoke", {"origin": KERNEL_A.origin})
    assert denied["error"]["data"]["code"] == "UNAUTHORIZED"
    assert (await call(KERNEL_B, "grants.list", {}))["result"]["grants"] == []
    assert len((await call(BROWSER, "grants.list", {}))["result"]["grants"]) == 1
    assert (await call(KERNEL_B, "audit.tail", {}))["result"]["records"] == []
    assert (await call(KERNEL_B, "kill", {"all": True}))["error"]["data"]["code"] == "UNAUTHORIZED"
    assert (await call(BROWSER, "grants.get", {}))["error"]["data"]["code"] == "UNAUTHORIZED"
    missing = await call(KERNEL_A, "runs.cancel", {"run_id": "r"})
    assert missing["error"]["data"]["code"] in ("UNAVAILABLE", "NOT_FOUND")
    assert (await call(BROWSER, "grants.revoke", {"origin": KERNEL_A.origin}))["result"]["revoked"] is True
    assert (await call(KERNEL_A, "grants.get", {}))["result"]["grant"] is None


@pytest.mark.asyncio
async def test_strict_params(broker, call):
    r = await call(KERNEL_A, "grants.list", {"bogus": 1})
    assert r["error"]["code"] == -32602 and r["error"]["data"]["errors"][0]["type"] == "extra_forbidden"
    r = await call(KERNEL_A, "audit.tail", {"n": 10**9})
    assert r["error"]["code"] == -32602
    r = await call(KERNEL_A, "permission.answer", {"request_id": "x", "decision": "maybe"})
    assert r["error"]["code"] == -32602 and "maybe" not in str(r)  # input is never echoed


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_live_frames_equal_replay_and_encode_event(kind, tmp_path):
    """The bus hands subscribers the frame the SQLite store stored (no second encoding); what a live
    subscriber gets must be byte-identical to replay and to encode_event, for either store, and from
    a worker thread too."""
    from relay_jupyter.broker.events import EventBus
    from relay_jupyter.core.memory import MemoryEventStore
    from relay_jupyter.protocol.sse import encode_event
    from relay_jupyter.storage import Store

    store = Store.open(tmp_path / "relay.db") if kind == "sqlite" else MemoryEventStore()
    try:
        bus = EventBus(store)
        sub = bus.subscribe(BROWSER, maxsize=100)
        events = [bus.append("run.text_delta", {"text": "é \"q\"\n😀"}, origin=KERNEL_A.origin, run_id="r1")]
        events += bus.append_many([("t", {"n": n, "f": 2.5}, None, None) for n in range(3)])
        events += await asyncio.to_thread(bus.append_many, [("t", {"from": "thread"}, KERNEL_B.origin, None)])
        async with asyncio.timeout(2):
            while sub.pending < 5:
                await sub.wait(1)
        live = sub.drain()
        assert [i for i, _ in live] == [e.id for e in events] == [1, 2, 3, 4, 5]
        assert [f for _, f in live] == [encode_event(e) for e in events]
        assert bus.replay_frames(BROWSER, 0, limit=100)[1] == b"".join(f for _, f in live)
    finally:
        if kind == "sqlite":
            store.close()
