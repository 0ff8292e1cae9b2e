"""The same endpoints on a plain tornado Application with a pluggable caller (the daemon's base)."""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from relay_http import read_response, request

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.server.plain import UNAUTHORIZED_BODY, make_app

CALLER = Caller(kind=CallerKind.DAEMON, origin="daemon:test", client_id="daemon:test:1")


@pytest_asyncio.fixture
async def served():
    broker = Broker.open(BrokerConfig(in_memory=True, heartbeat_interval=0.1))

    def resolve(handler):
        return CALLER if handler.request.headers.get("Authorization") == "Bearer good" else None

    server = make_app(broker, resolve).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, port
    server.stop()
    await server.close_all_connections()
    broker.close()


@pytest.mark.asyncio
async def test_plain_app_auth_and_rpc(served):
    broker, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"jsonrpc":"2.0","id":1,"method":"grants.get"}'
    try:
        answers = []
        for auth in ({}, {"Authorization": "Bearer bad"}, {"Authorization": "bearer good"}):
            for path, method in (("/relay/rpc", "POST"), ("/relay/healthz", "GET"), ("/relay/metrics", "GET")):
                r2, w2 = await asyncio.open_connection("127.0.0.1", port)
                w2.write(request(method, path, headers=auth, body=body if method == "POST" else b""))
                status, _, raw = await read_response(r2)
                w2.close()
                answers.append((status, raw))
        assert {a for a in answers} == {(401, UNAUTHORIZED_BODY)}  # one byte-identical 401
        writer.write(request("POST", "/relay/rpc", headers={"Authorization": "Bearer good"}, body=body))
        status, _, raw = await read_response(reader)
        assert status == 200 and json.loads(raw)["result"] == {"grant": None}
    finally:
        writer.close()
