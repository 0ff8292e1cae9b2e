"""A team's remaining budget bounds an engine's fitted ``max_tokens`` (issue 17 with issue 15's teams;
``Gate.completion_room``): the notebook's own grant has no limit, its team has a small day token (or cost) limit,
and relay's Anthropic endpoint lowers the engine's 32000 to what the team still leaves after the input — with the
holds of the team's other requests in flight counted — instead of refusing it; when the team leaves less than
:data:`MIN_FITTED_OUTPUT`, the request is refused and nothing is forwarded. The team's ledger never goes over.

A real broker with a configured team and its :class:`AnthropicProxy` over the shipped ``FakeAnthropic``.
"""

from __future__ import annotations

import json

import pytest

from relay_jupyter.broker.anthropic_proxy import MIN_FITTED_OUTPUT, AnthropicProxy, ProxyError
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.budgets import RunBudget
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.testing import FakeAnthropic, Reply

pytestmark = pytest.mark.asyncio

KEY = "sk-ant-broker-key-team-fit-0123456789"
ORIGIN = "notebook:team-fit.ipynb"
MODEL = "claude-sonnet-4-5"
TEAM_TOKENS = 12_000


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY, default=Reply("ok")) as server:
        yield server


def _broker(tmp_path, fake, team: dict) -> Broker:
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL, user="alice",
                                      teams={"ml": {"members": ["alice", "bob"], **team}}))
    # the notebook's own grant has no token or cost limit: only the team's can bound the request
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}),
                              budget=Budget(tokens_per_day=None, cost_per_day_usd=None, max_tokens_per_run=None),
                              consent_id="t"))
    return broker


def _body(max_tokens: int = 32_000) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "say ok"}]}).encode()


async def _send(proxy: AnthropicProxy, run: RunBudget | None) -> None:
    response = await proxy.messages(ORIGIN, _body(), {}, {}, run=run)
    async for _ in response.chunks:
        pass


def _allowed(broker: Broker) -> list:
    return [r for r in broker.audit.tail(1000, origin=ORIGIN) if r.tool == f"model:{MODEL}" and r.decision == "allow"]


def _team(broker: Broker) -> dict:
    [team] = broker.gate.ledger.team_usage(ORIGIN)
    return team


async def test_a_small_team_day_budget_lowers_an_engine_request_instead_of_refusing_it(tmp_path, fake):
    broker = _broker(tmp_path, fake, {"tokens_per_day": TEAM_TOKENS})
    proxy = AnthropicProxy(broker)
    try:
        with pytest.raises(ProxyError) as refused:  # a kernel's SDK client: its max_tokens stands, the team refuses
            await _send(proxy, None)
        assert refused.value.code == "BUDGET_EXCEEDED" and "team ml" in refused.value.message
        assert fake.requests == []

        await _send(proxy, RunBudget(None, None))  # an engine's run: fitted to the team
        (sent,) = fake.requests
        (allowed,) = _allowed(broker)
        assert allowed.arguments["max_tokens_asked"] == 32_000
        assert allowed.arguments["estimated_tokens"] == TEAM_TOKENS  # exactly what the team had left
        assert MIN_FITTED_OUTPUT <= sent.body["max_tokens"] == allowed.arguments["max_output_tokens"] < TEAM_TOKENS
        team = _team(broker)
        assert team["day"]["tokens"] <= TEAM_TOKENS and team["day"]["reserved_tokens"] == 0

        # another member's request in flight holds most of what is left: the next one fits around it or is refused
        left = _team(broker)["remaining_tokens"]
        hold = broker.gate.ledger.reserve("user:bob/notebook:b.ipynb", broker.grants.get(ORIGIN),
                                          tokens=max(0, left - MIN_FITTED_OUTPUT // 2), cost_usd=0.0)
        try:
            before = len(fake.requests)
            with pytest.raises(ProxyError) as refused:
                await _send(proxy, RunBudget(None, None))
            assert refused.value.code == "BUDGET_EXCEEDED" and len(fake.requests) == before
        finally:
            hold.release()
        assert _team(broker)["day"]["tokens"] <= TEAM_TOKENS
    finally:
        await proxy.aclose()
        broker.close()


async def test_a_team_cost_budget_bounds_the_reservation(tmp_path, fake):
    broker = _broker(tmp_path, fake, {"cost_per_day_usd": 0.05})
    proxy = AnthropicProxy(broker)
    try:
        await _send(proxy, RunBudget(None, None))
        (allowed,) = _allowed(broker)
        assert allowed.arguments["max_tokens_asked"] == 32_000 and allowed.arguments["reserved_usd"] <= 0.05
        assert MIN_FITTED_OUTPUT <= fake.requests[-1].body["max_tokens"] < 32_000
        assert _team(broker)["day"]["cost_usd"] <= 0.05
    finally:
        await proxy.aclose()
        broker.close()
