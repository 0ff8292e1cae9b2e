"""The admin policy in a real broker (issue 15 item 3): a grant of everything is read back narrowed to the
policy (grants.get, grants.list), a tool outside the policy is refused by the gate even though the grant
allows every tool, a run in a mode the policy leaves out is refused, and a bad policy stops the broker in one
line."""

from __future__ import annotations

import asyncio
import json

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import ConfigRefusal
from relay_jupyter.testing import FakeAnthropic, Reply, text

KEY = "sk-ant-test-admin-policy-0123456789"

NB = Caller(kind=CallerKind.DAEMON, origin="user:alice/notebook:a.ipynb", client_id="user:alice/kernel:a.ipynb",
            user="alice")
POLICY = {"tools": ["scratch_list", "scratch_read"], "models": ["claude-haiku-4-5"], "modes": ["ask", "review"],
          "max_budget": {"tokens_per_day": 1_000_000, "cost_per_day_usd": 50}}


async def _call(broker: Broker, method: str, params: dict) -> dict:
    raw = await broker.dispatch(NB, json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode())
    return json.loads(raw)


async def _run(broker: Broker, model: str) -> dict:
    started = await _call(broker, "run.start", {"conversation": model, "prompt": "hi", "model": model})
    assert "result" in started, started
    run_id = started["result"]["run_id"]
    for _ in range(600):
        run = (await _call(broker, "runs.get", {"run_id": run_id}))["result"]["run"]
        if run["state"] != "running":
            events = [e.model_dump() for e in broker.store.events_since(0) if e.run_id == run_id]
            return {**run, "events": events}
        await asyncio.sleep(0.05)  # the run ends on this loop; polling its journal
    raise AssertionError(f"run {run_id} did not end")


@pytest.mark.asyncio
async def test_a_grant_of_everything_is_narrowed_to_the_policy(tmp_path) -> None:
    with FakeAnthropic(api_key=KEY, default=Reply(text("fine"))) as fake:
        await _scenario(tmp_path, fake)


async def _scenario(tmp_path, fake) -> None:
    broker = Broker.open(BrokerConfig(in_memory=True, admin_policy=POLICY, anthropic_base_url=fake.base_url,
                                      anthropic_api_key=KEY))
    try:
        install_components(broker, jupyter_root=tmp_path)
        created = await _call(broker, "grants.create", {"tools": ["*"], "models": ["*"],
                                                        "budget": {"tokens_per_day": None, "cost_per_day_usd": None}})
        assert "result" in created, created
        grant = (await _call(broker, "grants.get", {}))["result"]["grant"]
        assert sorted(grant["tools"]) == ["scratch_list", "scratch_read"] and grant["models"] == ["claude-haiku-4-5"]
        assert grant["budget"]["tokens_per_day"] == 1_000_000 and grant["budget"]["cost_per_day_usd"] == 50
        [listed] = (await _call(broker, "grants.list", {}))["result"]["grants"]
        assert listed == grant
        # the gate reads the narrowed grant: a model the grant names ("*") but the policy does not is refused
        refused = await _run(broker, "claude-sonnet-4-5")
        allowed = await _run(broker, "claude-haiku-4-5")
        assert allowed["state"] == "done", allowed
        assert refused["state"] != "done", refused
        assert "claude-sonnet-4-5" in json.dumps(refused)
        # a run in a mode the policy leaves out
        full = await _call(broker, "run.start", {"conversation": "c1", "prompt": "hi", "mode": "full"})
        assert full["error"]["data"]["code"] == "SCOPE_EXCEEDED" and "full" in full["error"]["message"], full
        # the stored grant is what the user consented to; the policy is applied on read
        assert broker.store.get_grant(NB.origin).tools == frozenset({"*"})
    finally:
        broker.close()


def test_a_bad_policy_stops_the_broker_in_one_line() -> None:
    with pytest.raises(ConfigRefusal) as err:
        BrokerConfig(in_memory=True, admin_policy={"modes": ["yolo"]})
    assert err.value.message.startswith("c.RelayApp.admin_policy.modes") and "\n" not in err.value.message

