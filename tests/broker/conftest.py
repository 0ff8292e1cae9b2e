"""In-memory brokers and callers for broker unit tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller


@pytest_asyncio.fixture
async def broker():
    b = Broker.open(BrokerConfig(in_memory=True, consent_timeout=2.0, kernel_tool_timeout=2.0))
    yield b
    b.close()


@pytest.fixture
def call(broker):
    """``await call(caller, method, params)`` -> the JSON-RPC response dict."""

    async def go(caller: Caller, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            body["params"] = params
        raw = await broker.dispatch(caller, json.dumps(body).encode())
        return json.loads(raw)

    return go
