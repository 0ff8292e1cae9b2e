"""The daemon's client-id scheme: the originator ``daemon:<name>`` answers its permission requests from a
new connection (after a reconnect, with replay); another name gets NOT_ORIGINATOR. In-process app, real HTTP."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.types import ConsentDecision, ConsentRequest, ToolClass, ToolRequest, ToolSpec
from relay_jupyter.server.daemon_auth import DaemonGate, daemon_caller
from relay_jupyter.server.plain import make_app


@pytest_asyncio.fixture
async def served():
    broker = Broker.open(BrokerConfig(in_memory=True, heartbeat_interval=0.2))
    gate = DaemonGate("unix")  # the transport already vouched for the peer: no token
    server = make_app(broker, gate, activity=gate, scrub=gate.scrub).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, port, gate
    server.stop()
    await server.close_all_connections()
    broker.close()


async def _post(port: int, name: str, msg: dict) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(msg).encode()
    writer.write(b"POST /relay/rpc HTTP/1.1\r\nHost: x\r\nX-Relay-Client: " + name.encode() +
                 b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    raw = await reader.read()
    writer.close()
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


@pytest.mark.asyncio
async def test_originator_answers_after_reconnecting(served):
    broker, port, gate = served
    me = daemon_caller("nb")
    assert me.origin == "daemon:nb" and me.client_id == "daemon:nb"
    req = ToolRequest(origin=me.origin, tool=ToolSpec(name="run_code", tool_class=ToolClass.WRITE),
                      arguments={"code": "1"}, call_id="c1", run_id="run1", originator=me.client_id)
    ask = asyncio.create_task(broker.permissions.ask(
        ConsentRequest(request_id="pr_x", request=req, deadline=time.time() + 30)))
    async with asyncio.timeout(5):
        while not broker.permissions.pending_for(me):
            await asyncio.sleep(0.01)
    # a fresh connection with the same name replays the pending request
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /relay/events?since=0 HTTP/1.1\r\nHost: x\r\nX-Relay-Client: nb\r\n\r\n")
    seen = b""
    async with asyncio.timeout(5):
        while b"pr_x" not in seen:
            seen += await reader.read(4096)
    assert b"permission.request" in seen
    assert gate.idle_for() == 0  # an open event stream is activity
    writer.close()
    answer = {"jsonrpc": "2.0", "id": 1, "method": "permission.answer",
              "params": {"request_id": "pr_x", "decision": "allow"}}
    other = await _post(port, "other", answer)
    assert other["error"]["data"]["code"] == "NOT_ORIGINATOR"
    mine = await _post(port, "nb", answer)
    assert mine["result"]["answered_by"] == "daemon:nb"
    async with asyncio.timeout(5):
        result = await ask
    assert result.decision is ConsentDecision.ALLOW
