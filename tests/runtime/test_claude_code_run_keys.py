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


@pytest.mark.asyncio
async def test_an_engine_runs_profile_is_the_endpoints_never_a_header_of_the_subprocess(tmp_path):
    """The engine endpoint sends every request of a run to the run's profile (``%%agent --profile``), and a run
    without one to the broker's own upstream, whatever ``X-Relay-Profile`` the subprocess (or a command it runs with
    the run's key) sends."""
    import json

    import httpx

    from relay_jupyter.core.types import Grant
    from relay_jupyter.testing import FakeAnthropic, Reply

    key, team_key = "sk-ant-default-0123456789", "sk-ant-team-0123456789"
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": team_key, "other.anthropic": team_key}))
    secrets.chmod(0o600)
    with FakeAnthropic(api_key=key, default=Reply("default")) as default, \
            FakeAnthropic(api_key=team_key, default=Reply("team")) as team:
        broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", anthropic_api_key=key,
                                          anthropic_base_url=default.base_url, secrets_file=secrets,
                                          profiles={"team": {"anthropic_base_url": team.base_url},
                                                    "other": {"anthropic_base_url": team.base_url}}))
        broker.grants.issue(Grant(origin="notebook:a.ipynb", tools=frozenset({"*"}), models=frozenset({"*"}),
                                  profiles=frozenset({"*"}), consent_id="t"))
        endpoint = EngineEndpoint(broker)
        body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                async with endpoint.session("notebook:a.ipynb", "run-1") as plain:
                    r = await client.post(f"{plain.base_url}/v1/messages", json=body,
                                          headers={"x-api-key": plain.key, "X-Relay-Profile": "team"})
                    assert r.status_code == 200 and len(default.requests) == 1 and team.requests == []
                async with endpoint.session("notebook:a.ipynb", "run-2", profile="team") as profiled:
                    r = await client.post(f"{profiled.base_url}/v1/messages", json=body,
                                          headers={"x-api-key": profiled.key, "X-Relay-Profile": "other"})
                    assert r.status_code == 200 and len(team.requests) == 1 and len(default.requests) == 1
            purposes = [r.arguments.get("purpose") for r in broker.audit.tail(100, origin="notebook:a.ipynb")
                        if r.decision == "allow" and r.tool.startswith("model:")]
            assert purposes == ["proxy", "proxy:team"]
        finally:
            await endpoint.aclose()
            broker.close()
