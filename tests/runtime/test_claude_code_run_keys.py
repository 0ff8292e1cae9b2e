"""The one key bookkeeping of the broker's loopback listeners (``broker/run_keys.py``), used by relay's engine
endpoint (the claude CLI's per-run Anthropic key) and the MCP gateway (the CLI's per-run MCP token): a key opens
only its own listener while its run lives, a revoked, altered, empty or oversized one opens nothing."""

from __future__ import annotations

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.engine_endpoint import EngineEndpoint
from relay_jupyter.broker.mcp_gateway import McpGateway
from relay_jupyter.broker.run_keys import MAX_KEY_CHARS, KeyRing




def test_a_key_ring_finds_only_live_exact_keys():
    ring: KeyRing[str] = KeyRing()
    a, b = KeyRing.new_key("p-"), KeyRing.new_key("p-")
    assert a != b and a.startswith("p-") and len(a) > 40
    ring.add(a, "A")
    ring.add(b, "B")
    assert (ring.find(a), ring.find(b)) == ("A", "B")
    for wrong in ("", a[:-1], a + "x", a.upper(), "p-" + "x" * (MAX_KEY_CHARS + 1)):
        assert ring.find(wrong) is None
    assert ring.pop(a) == "A" and ring.find(a) is None and ring.pop(a) is None
    assert ring.drop(lambda h: h == "B") == 1 and ring.find(b) is None and len(ring) == 0


@pytest.mark.asyncio
async def test_an_engine_key_and_a_gateway_token_each_open_only_their_own_listener(tmp_path):
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    endpoint, gateway = EngineEndpoint(broker), McpGateway(broker)
    try:
        async with endpoint.session("notebook:a.ipynb", "run-1") as run:
            mcp = await gateway.session("notebook:a.ipynb", run_id="run-1")
            assert endpoint.authenticate(run.key) is run and gateway.authenticate(mcp.token) is mcp
            assert endpoint.authenticate(mcp.token) is None and gateway.authenticate(run.key) is None
            assert gateway.end(mcp) and gateway.authenticate(mcp.token) is None
            key = run.key
        assert endpoint.authenticate(key) is None  # revoked when the run's session ends
        other = await gateway.session("notebook:b.ipynb")
        assert gateway.end_origin("notebook:b.ipynb") == 1 and gateway.authenticate(other.token) is None
    finally:
        await endpoint.aclose()
        await gateway.aclose()
        broker.close()
