"""Profiles (issue 16 item 6): named upstreams of the model endpoints (``c.RelayApp.profiles``), keys from the
secrets file only, a grant listing which profiles its origin may use, ``X-Relay-Profile`` on the request
(``relay.anthropic(profile=...)`` sends it), every profile URL under the one endpoint policy, and
``jupyter relay profiles list``. The official SDKs against the daemon's plain app in process and the shipped
fake upstreams (each refuses any key but its own).

Proves: a profile request reaches that profile's upstream with that profile's key (from the secrets file) and
the default request the broker's own; a profile the grant does not list, an unknown profile and a profile
without the wire's URL are refused before anything is forwarded (audited); a key value in the configuration
and a URL outside the endpoint policy stop the broker at start; widening a grant's profiles needs a fresh
consent; the CLI shows each key's secrets-file entry and whether it is there, never the key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import anthropic
import openai
import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import ConfigRefusal, GateRefusal
from relay_jupyter.core.types import Grant
from relay_jupyter.kernel.errors import AgentError
from relay_jupyter.kernel.sdk_clients import anthropic_client
from relay_jupyter.server.plain import make_app
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI
from relay_jupyter.testing.script import Reply, Usage, text

DEFAULT_KEY = "sk-ant-default-key-0123456789abcdef"
TEAM_KEY = "sk-ant-team-key-fedcba9876543210"
CLAUDE, GPT = "claude-test-1", "gpt-fake-1"
HI = [{"role": "user", "content": "hi"}]


def _secrets(tmp: Path) -> Path:
    path = tmp / "secrets.json"
    path.write_text(json.dumps({"team.anthropic": TEAM_KEY}))
    path.chmod(0o600)
    return path


@pytest_asyncio.fixture
async def served(tmp_path):
    with FakeAnthropic(api_key=DEFAULT_KEY, models=(CLAUDE,)) as default, \
            FakeAnthropic(api_key=TEAM_KEY, models=(CLAUDE,)) as team, FakeOpenAI(models=(GPT,)) as local:
        broker = Broker.open(BrokerConfig(
            in_memory=True, anthropic_api_key=DEFAULT_KEY, anthropic_base_url=default.base_url,
            secrets_file=_secrets(tmp_path),
            profiles={"team": {"anthropic_base_url": team.base_url}, "local": {"openai_base_url": local.base_url}}))

        def resolve(handler):
            name = handler.request.headers.get("X-Relay-Client", "default")
            return Caller(kind=CallerKind.DAEMON, origin=f"daemon:{name}", client_id=f"daemon:{name}:1")

        server = make_app(broker, resolve).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        yield broker, f"http://127.0.0.1:{port}/relay/", default, team, local
        server.stop()
        await server.close_all_connections()
        for name in ("relay_anthropic_proxy", "relay_openai_proxy"):
            proxy = server.request_callback.settings.get(name)
            if proxy is not None:
                await proxy.aclose()
        broker.close()


def _grant(broker: Broker, name: str, profiles: set[str]) -> str:
    origin = f"daemon:{name}"
    broker.grants.issue(Grant(origin=origin, models=frozenset({CLAUDE, GPT}), profiles=frozenset(profiles),
                              consent_id=f"c-{name}"))
    return origin


def _claude(base: str, name: str, profile: str | None = None) -> anthropic.AsyncAnthropic:
    headers = {"X-Relay-Client": name, **({"X-Relay-Profile": profile} if profile else {})}
    return anthropic.AsyncAnthropic(api_key="x", base_url=base + "anthropic", default_headers=headers, max_retries=0)


@pytest.mark.asyncio
async def test_a_profile_request_reaches_that_profiles_upstream_with_its_key(served) -> None:
    broker, base, default, team, local = served
    origin = _grant(broker, "ds", {"team"})
    team.enqueue(Reply(text("from the team gateway")))
    default.enqueue(Reply(text("from the default upstream")))
    via_team = await _claude(base, "ds", "team").messages.create(model=CLAUDE, max_tokens=16, messages=HI)
    via_default = await _claude(base, "ds").messages.create(model=CLAUDE, max_tokens=16, messages=HI)
    assert via_team.content[0].text == "from the team gateway"  # the team fake accepts only TEAM_KEY
    assert via_default.content[0].text == "from the default upstream"
    assert len(team.requests) == 1 and len(default.requests) == 1
    allows = [r.arguments["purpose"] for r in broker.audit.tail(50, origin=origin) if r.decision == "allow"]
    assert allows == ["proxy:team", "proxy"]


@pytest.mark.asyncio
async def test_profiles_outside_the_grant_are_refused_before_anything_is_forwarded(served) -> None:
    broker, base, default, team, local = served
    origin = _grant(broker, "narrow", {"team"})
    with pytest.raises(openai.PermissionDeniedError) as denied:  # the grant does not list "local"
        await openai.AsyncOpenAI(api_key="x", base_url=base + "openai/v1", max_retries=0,
                                 default_headers={"X-Relay-Client": "narrow", "X-Relay-Profile": "local"}
                                 ).chat.completions.create(model=GPT, max_tokens=8, messages=HI)
    assert denied.value.body["code"] == "SCOPE_EXCEEDED" and "'local'" in denied.value.body["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await _claude(base, "narrow", "nope").messages.create(model=CLAUDE, max_tokens=8, messages=HI)
    assert "[NOT_FOUND]" in str(unknown.value)
    with pytest.raises(anthropic.PermissionDeniedError) as nogrant:
        await _claude(base, "stranger", "team").messages.create(model=CLAUDE, max_tokens=8, messages=HI)
    assert "[UNAUTHORIZED]" in str(nogrant.value)
    denials = [(r.tool, r.code) for r in broker.audit.tail(50, origin=origin) if r.decision == "deny"]
    assert denials == [("profile:local", "SCOPE_EXCEEDED")]
    assert not default.requests and not team.requests and not local.requests

    # the OpenAI wire through a profile that has its URL; the Anthropic wire through one that has none
    _grant(broker, "all", {"*"})
    local.enqueue(Reply(text("from the local server")))
    answer = await openai.AsyncOpenAI(api_key="x", base_url=base + "openai/v1", max_retries=0,
                                      default_headers={"X-Relay-Client": "all", "X-Relay-Profile": "local"}
                                      ).chat.completions.create(model=GPT, max_tokens=8, messages=HI)
    assert answer.choices[0].message.content == "from the local server"
    with pytest.raises(anthropic.BadRequestError) as nourl:
        await _claude(base, "all", "local").messages.create(model=CLAUDE, max_tokens=8, messages=HI)
    assert "anthropic_base_url" in str(nourl.value)
    assert not default.requests and not team.requests


def test_profile_configuration_is_checked_at_start(tmp_path) -> None:
    with pytest.raises(ConfigRefusal) as key:
        BrokerConfig(in_memory=True, profiles={"team": {"anthropic_base_url": "https://gw.example.com",
                                                        "anthropic_api_key": "sk-ant-inline"}})
    assert "secrets file" in key.value.message and "sk-ant-inline" not in key.value.message
    for url in ("http://gw.example.com", "https://user:pw@gw.example.com", "file:///etc/passwd"):
        with pytest.raises(ConfigRefusal) as policy:
            BrokerConfig(in_memory=True, profiles={"team": {"anthropic_base_url": url}})
        assert "c.RelayApp.profiles['team']" in policy.value.message and "pw" not in policy.value.message
    with pytest.raises(ConfigRefusal):
        BrokerConfig(in_memory=True, profiles={"bad name!": {"openai_base_url": "http://127.0.0.1:1/v1"}})
    with pytest.raises(ConfigRefusal):
        BrokerConfig(in_memory=True, profiles={"empty": {}})


def test_widening_a_grants_profiles_needs_a_fresh_consent() -> None:
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        _grant(broker, "p", {"team"})
        for wider in ({"team", "local"}, {"*"}):
            with pytest.raises(GateRefusal) as err:
                broker.grants.issue(Grant(origin="daemon:p", models=frozenset({CLAUDE}), consent_id="c-p",
                                          profiles=frozenset(wider)))
            assert "profiles" in err.value.message
    finally:
        broker.close()


def test_relay_anthropic_sends_the_profile() -> None:
    endpoint = SimpleNamespace(url="http://127.0.0.1:1/relay/", auth="RelayKernel cred", client_name="kernel")
    client = anthropic_client(endpoint, profile="team")
    assert client.default_headers["X-Relay-Profile"] == "team" and client.api_key == "cred"
    assert "X-Relay-Profile" not in anthropic_client(endpoint).default_headers


def test_relay_openai_sends_the_profile_to_the_openai_endpoint() -> None:
    from relay_jupyter.kernel.sdk_clients import openai_client

    endpoint = SimpleNamespace(url="http://127.0.0.1:1/relay/", auth="RelayKernel cred", client_name="kernel")
    client = openai_client(endpoint, profile="local", max_retries=0)
    assert str(client.base_url) == "http://127.0.0.1:1/relay/openai/v1/" and client.api_key == "cred"
    assert client.default_headers["X-Relay-Profile"] == "local"
    assert "X-Relay-Profile" not in openai_client(endpoint).default_headers
    with pytest.raises(AgentError):
        openai_client(endpoint, profile=" ")
    on_socket = openai_client(SimpleNamespace(url="unix:///run/relay.sock", auth="", client_name="kernel"))
    assert str(on_socket.base_url) == "http://localhost/relay/openai/v1/"  # the daemon's socket, its own transport


def test_profiles_list_shows_entries_never_keys(tmp_path) -> None:
    config = tmp_path / "broker.json"
    config.write_text(json.dumps({"secrets_file": str(_secrets(tmp_path)), "profiles": {
        "team": {"anthropic_base_url": "https://gw.example.com", "description": "the team gateway"},
        "local": {"openai_base_url": "http://127.0.0.1:8080/v1"}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "RELAY_"))}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "profiles", "list", "--config", str(config),
                           "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {r["profile"]: r for r in json.loads(done.stdout)["profiles"]}
    assert rows["team"]["anthropic"] == {"base_url": "https://gw.example.com", "key_entry": "team.anthropic",
                                         "key": "present"}
    assert rows["local"]["openai"]["key"] == "missing" and rows["local"]["anthropic"] is None
    assert TEAM_KEY not in done.stdout + done.stderr


@pytest.mark.asyncio
async def test_a_profile_capped_in_the_grant_is_counted_apart_from_the_grants_budget(served) -> None:
    """``Grant.profile_budgets`` (issue 16 leftover): the "team" profile capped at its own day budget while the
    default upstream draws only on the grant's budget. A request to the team that would pass the team's day
    budget is refused before anything is forwarded (429 ``BUDGET_EXCEEDED``, audited deny), the default upstream
    still answers, and the team's row counts only the team's requests."""
    from relay_jupyter.core.budgets import profile_key
    from relay_jupyter.core.types import Budget, ProfileBudget

    broker, base, default, team, local = served
    origin = "daemon:capped"
    broker.grants.issue(Grant(origin=origin, models=frozenset({CLAUDE}), profiles=frozenset({"team"}),
                              budget=Budget(tokens_per_day=100_000, cost_per_day_usd=None),
                              profile_budgets=(ProfileBudget(profile="team", tokens_per_day=300),),
                              consent_id="c-capped"))
    team.enqueue(Reply(text("team, once"), usage=Usage(input_tokens=20, output_tokens=10)))
    first = await _claude(base, "capped", "team").messages.create(model=CLAUDE, max_tokens=200, messages=HI)
    assert first.content[0].text == "team, once"
    # the team has 270 left: a request reserving more (its input plus max_tokens) is refused, nothing forwarded
    with pytest.raises(anthropic.RateLimitError) as spent:
        await _claude(base, "capped", "team").messages.create(model=CLAUDE, max_tokens=280, messages=HI)
    assert "[BUDGET_EXCEEDED]" in str(spent.value) and "profile team's daily token budget of 300" in str(spent.value)
    assert len(team.requests) == 1
    # the broker's own upstream is not the team's: the same request goes through on the grant's budget
    default.enqueue(Reply(text("default, fine"), usage=Usage(input_tokens=20, output_tokens=10)))
    via_default = await _claude(base, "capped").messages.create(model=CLAUDE, max_tokens=280, messages=HI)
    assert via_default.content[0].text == "default, fine" and len(default.requests) == 1

    usage = broker.ledger.usage(origin, broker.grants.get(origin))
    assert usage["tokens"] == 60  # the grant's budget counts both answered requests
    (row,) = usage["profiles"]
    assert (row["profile"], row["tokens"], row["tokens_limit"], row["remaining_tokens"]) == ("team", 30, 300, 270)
    assert broker.ledger._ledger.usage(profile_key(origin, "team"), usage["day"])[0] == 30
    denied = [(r.code, r.arguments.get("purpose")) for r in broker.audit.tail(50, origin=origin)
              if r.decision == "deny"]
    assert denied == [("BUDGET_EXCEEDED", "proxy:team")]


def test_a_profile_budget_only_narrows_without_a_fresh_consent() -> None:
    from relay_jupyter.core.types import Budget, ProfileBudget

    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        def grant(*budgets: ProfileBudget, consent: str = "c-pb") -> Grant:
            return Grant(origin="daemon:pb", models=frozenset({CLAUDE}), profiles=frozenset({"team"}),
                         budget=Budget(), profile_budgets=budgets, consent_id=consent)

        broker.grants.issue(grant(ProfileBudget(profile="team", tokens_per_day=1000, cost_per_day_usd=1.0)))
        for wider in ((), (ProfileBudget(profile="team", tokens_per_day=2000, cost_per_day_usd=1.0),),
                      (ProfileBudget(profile="team", tokens_per_day=1000),)):
            with pytest.raises(GateRefusal) as err:
                broker.grants.issue(grant(*wider))
            assert "profile_budgets" in err.value.message
        narrower = broker.grants.issue(grant(ProfileBudget(profile="team", tokens_per_day=500, cost_per_day_usd=1.0),
                                             ProfileBudget(profile="local", cost_per_day_usd=0.5)))
        assert [p.profile for p in narrower.profile_budgets] == ["local", "team"]
        with pytest.raises(ValueError):  # one budget per profile
            grant(ProfileBudget(profile="team", tokens_per_day=1), ProfileBudget(profile="team", tokens_per_day=2))
    finally:
        broker.close()


def test_grants_add_takes_profile_budgets_in_one_line_or_refuses_in_one_line() -> None:
    from relay_jupyter.cli.grants import parse_profile_budget

    parsed = parse_profile_budget("team:tokens=50000,cost=2.5")
    assert (parsed.profile, parsed.tokens_per_day, parsed.cost_per_day_usd) == ("team", 50000, 2.5)
    for bad in ("team", ":tokens=5", "team:", "team:tokens=-1", "team:tokens=1.5", "team:rpm=3", "team:cost=x"):
        with pytest.raises(ConfigRefusal) as err:
            parse_profile_budget(bad)
        assert err.value.message.startswith("--profile-budget: ") and "\n" not in err.value.message


def test_a_profile_run_of_the_relay_engine_draws_on_that_profiles_budget_too() -> None:
    """``%%agent --profile team`` reserves with purpose ``agent:team`` (runtime/relay_loop.py): the gate holds it to
    the team's budget as the endpoints' ``proxy:team``; a request without a profile is not."""
    from relay_jupyter.core.errors import GateRefusal as Refused
    from relay_jupyter.core.gate import profile_of_purpose
    from relay_jupyter.core.types import Budget, ProfileBudget

    assert [profile_of_purpose(p) for p in ("agent:team", "proxy:local", "proxy", "review", None, "agent:")] == [
        "team", "local", None, None, None, None]
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        broker.grants.issue(Grant(origin="daemon:run", models=frozenset({CLAUDE}), profiles=frozenset({"team"}),
                                  budget=Budget(tokens_per_day=10_000, cost_per_day_usd=None),
                                  profile_budgets=(ProfileBudget(profile="team", tokens_per_day=1000),),
                                  consent_id="c-run"))
        held = broker.gate.begin_completion("daemon:run", CLAUDE, estimated_tokens=800, purpose="agent:team")
        with pytest.raises(Refused) as err:
            broker.gate.begin_completion("daemon:run", CLAUDE, estimated_tokens=800, purpose="agent:team")
        assert err.value.data["limit"] == "profile_tokens_per_day" and err.value.data["profile"] == "team"
        broker.gate.begin_completion("daemon:run", CLAUDE, estimated_tokens=800).release()  # no profile: fine
        held.release()
        broker.gate.begin_completion("daemon:run", CLAUDE, estimated_tokens=800, purpose="agent:team").release()
    finally:
        broker.close()
