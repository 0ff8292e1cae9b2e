"""Smoke: the extension loads and answers on every endpoint. (jp_* tests are run by pytest-jupyter's own loop:
no @pytest.mark.asyncio, which would run them on a loop where the server is not serving.)"""

import json


async def test_rpc_roundtrip_as_browser(rpc, broker):
    reply = await rpc("grants.list", {})
    assert reply == {"jsonrpc": "2.0", "id": 1, "result": {"grants": []}}


async def test_health_ready_metrics(jp_fetch):
    r = await jp_fetch("relay", "healthz")
    assert json.loads(r.body) == {"status": "ok"}
    r = await jp_fetch("relay", "readyz")
    assert json.loads(r.body)["ready"] is True
    r = await jp_fetch("relay", "metrics")
    assert r.headers["Content-Type"].startswith("text/plain")
    assert b"relay_active_runs" in r.body
