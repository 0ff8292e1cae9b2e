"""An engine's model request is fitted to its budgets (docs/engines.md "Caps and budgets"): relay's endpoint lowers
the ``max_tokens`` of a request of an engine's run to what the run's token cap and the origin's day token and cost
budgets leave after its input, so a request whose client asks far more than it uses (the claude CLI: 32000) is
forwarded instead of refused; below :data:`MIN_FITTED_OUTPUT` it is refused, forwarding nothing. A request that is
not an engine's (a kernel's SDK client) keeps its ``max_tokens``: it is forwarded as asked or refused.

A real broker and its :class:`AnthropicProxy` over the shipped ``FakeAnthropic`` (loopback), no CLI.
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

KEY = "sk-ant-broker-key-fit-0123456789"
ORIGIN = "notebook:fit.ipynb"
MODEL = "claude-sonnet-4-5"


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY, default=Reply("ok")) as server:
        yield server


def _broker(tmp_path, fake, budget: Budget) -> Broker:
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL))
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}), budget=budget,
                              consent_id="t"))
    return broker


def _body(max_tokens: int = 32_000) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": True, "unknown_field": {"kept": True},
                       "messages": [{"role": "user", "content": "say ok"}]}).encode()


async def _send(proxy: AnthropicProxy, run: RunBudget | None, max_tokens: int = 32_000) -> None:
    response = await proxy.messages(ORIGIN, _body(max_tokens), {}, {}, run=run)
    async for _ in response.chunks:
        pass


def _allowed(broker: Broker) -> list:
    return [r for r in broker.audit.tail(1000, origin=ORIGIN) if r.tool == f"model:{MODEL}" and r.decision == "allow"]


async def test_the_day_token_budget_lowers_an_engine_request_and_refuses_a_kernel_client_as_before(tmp_path, fake):
    broker = _broker(tmp_path, fake, Budget(tokens_per_day=20_000, cost_per_day_usd=None, max_tokens_per_run=None))
    proxy = AnthropicProxy(broker)
    try:
        with pytest.raises(ProxyError) as refused:  # not an engine's run: the client's max_tokens stands
            await _send(proxy, None)
        assert refused.value.code == "BUDGET_EXCEEDED" and fake.requests == []

        await _send(proxy, RunBudget(None, None))
        (sent,) = fake.requests
        (allowed,) = _allowed(broker)
        assert sent.body["max_tokens"] == allowed.arguments["max_output_tokens"] < 20_000
        assert allowed.arguments["estimated_tokens"] == 20_000  # exactly what the day had left
        assert allowed.arguments["max_tokens_asked"] == 32_000
        assert sent.body["unknown_field"] == {"kept": True}  # the rest of the body as the client sent it
        usage = broker.gate.ledger.usage(ORIGIN)
        assert usage["tokens"] <= 20_000 and usage["reserved_tokens"] == 0
    finally:
        await proxy.aclose()
        broker.close()


async def test_the_day_cost_budget_and_the_run_cap_bound_the_reservation(tmp_path, fake):
    broker = _broker(tmp_path, fake, Budget(tokens_per_day=None, cost_per_day_usd=0.05, max_tokens_per_run=None))
    proxy = AnthropicProxy(broker)
    try:
        await _send(proxy, RunBudget(None, None))
        (allowed,) = _allowed(broker)
        assert allowed.arguments["reserved_usd"] <= 0.05 and allowed.arguments["max_tokens_asked"] == 32_000
        assert MIN_FITTED_OUTPUT <= fake.requests[-1].body["max_tokens"] < 32_000

        run = RunBudget(None, 3_000)  # the run's cap, tighter than what the day leaves
        await _send(proxy, run)
        assert _allowed(broker)[-1].arguments["estimated_tokens"] == 3_000
        assert 0 < run.tokens <= 3_000

        spent = RunBudget(None, MIN_FITTED_OUTPUT)  # not even a minimal answer after the input: refused
        before = len(fake.requests)
        with pytest.raises(ProxyError) as refused:
            await _send(proxy, spent)
        assert refused.value.code == "BUDGET_EXCEEDED" and "token limit" in refused.value.message
        assert len(fake.requests) == before
    finally:
        await proxy.aclose()
        broker.close()


async def test_a_request_that_already_fits_is_forwarded_unchanged(tmp_path, fake):
    broker = _broker(tmp_path, fake, Budget())
    proxy = AnthropicProxy(broker)
    try:
        await _send(proxy, RunBudget(None, None), max_tokens=2_000)
        assert fake.requests[-1].body["max_tokens"] == 2_000
        assert "max_tokens_asked" not in _allowed(broker)[-1].arguments
    finally:
        await proxy.aclose()
        broker.close()


async def test_a_profiles_own_day_budget_lowers_an_engine_request_to_that_profile(tmp_path, fake):
    """A claude-code run with ``--profile team`` (the engine endpoint sends the run's profile): the request is fitted
    to what the team profile's own day budget (``Grant.profile_budgets``) leaves, and the same request to the
    broker's own upstream, which the grant does not cap, is forwarded as asked."""
    from relay_jupyter.core.types import ProfileBudget

    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": KEY}))
    secrets.chmod(0o600)
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL, secrets_file=secrets,
                                      profiles={"team": {"anthropic_base_url": fake.base_url}}))
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}), profiles=frozenset({"team"}),
                              budget=Budget(tokens_per_day=None, cost_per_day_usd=None, max_tokens_per_run=None),
                              profile_budgets=(ProfileBudget(profile="team", tokens_per_day=20_000),), consent_id="t"))
    proxy = AnthropicProxy(broker)
    try:
        response = await proxy.messages(ORIGIN, _body(), {}, {"x-relay-profile": "team"}, run=RunBudget(None, None))
        async for _ in response.chunks:
            pass
        await _send(proxy, RunBudget(None, None))  # no profile: nothing caps it
        to_team, to_default = fake.requests
        assert to_team.body["max_tokens"] < 20_000 and to_default.body["max_tokens"] == 32_000
        team_allow, default_allow = _allowed(broker)
        assert team_allow.arguments["purpose"] == "proxy:team" and team_allow.arguments["estimated_tokens"] == 20_000
        assert default_allow.arguments["purpose"] == "proxy"
        (row,) = broker.gate.ledger.usage(ORIGIN, broker.grants.get(ORIGIN))["profiles"]
        assert row["profile"] == "team" and 0 < row["tokens"] <= 20_000 and row["reserved_tokens"] == 0
    finally:
        await proxy.aclose()
        broker.close()
