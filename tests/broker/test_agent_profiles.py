"""``%%agent --profile NAME`` (issue 16 item 6): ``run.start``'s ``profile`` runs the agent over that profile's
upstream (``c.RelayApp.profiles``, broker/profiles.run_backend), built by the backend registry with the
profile's key from the secrets file.

A real broker (``Broker.open``, the runtime over the backends its configuration builds) and three shipped fake upstreams, each
refusing any key but its own: the broker's default Anthropic, the ``team`` Anthropic profile, the ``local``
OpenAI-compatible profile. Proves: a profile run's requests reach only the profile's upstream, with the
profile's key, and the default run only the default's; the audit and telemetry rows name the profile; a profile
the grant does not list (``SCOPE_EXCEEDED``, audited), an unknown one (``NOT_FOUND`` naming ``jupyter relay
profiles list``), a profile without the wire's URL or its key and a bad name are refused before any request goes out,
for the claude-code engine too; ``run.started`` names the profile.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import backends_from_config, install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import InvalidParams, Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply

A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb#k1", client_id="kernel:aaa")
DEFAULT_KEY = "sk-ant-default-key-0123456789abcdef"
TEAM_KEY = "sk-ant-team-key-fedcba9876543210"
LOCAL_KEY = "sk-local-key-5566778899aabbcc"
CLAUDE, GPT = "claude-test-1", "gpt-fake-1"


@pytest.fixture
def upstreams(tmp_path: Path):
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": TEAM_KEY, "local.openai": LOCAL_KEY}))
    secrets.chmod(0o600)
    with FakeAnthropic(api_key=DEFAULT_KEY, models=(CLAUDE,), default=Reply("from default")) as default, \
            FakeAnthropic(api_key=TEAM_KEY, models=(CLAUDE,), default=Reply("from team")) as team, \
            FakeOpenAI(api_key=LOCAL_KEY, models=(GPT,), default=Reply("from local")) as local:
        broker = Broker.open(BrokerConfig(
            in_memory=True, default_model=CLAUDE, anthropic_api_key=DEFAULT_KEY,
            anthropic_base_url=default.base_url, secrets_file=secrets,
            profiles={"team": {"anthropic_base_url": team.base_url}, "local": {"openai_base_url": local.base_url},
                      "other": {"anthropic_base_url": team.base_url, "anthropic_key": "team.anthropic"},
                      "nokey": {"anthropic_base_url": team.base_url}}))
        install_runtime(broker, backends_from_config(broker.config))  # the broker's own: the default upstream
        try:
            yield broker, default, team, local
        finally:
            broker.close()


def grant(broker: Broker, profiles: set[str], consent: str = "c") -> None:
    broker.grants.issue(Grant(origin=A.origin, tools=frozenset({"*"}), models=frozenset({CLAUDE, GPT}),
                              profiles=frozenset(profiles), consent_id=consent))


async def run(broker: Broker, **params) -> tuple[str, str]:
    started = await call_method(broker, A, "run.start", {"conversation": "cell-1", "prompt": "hi", **params})
    run_id = started["run_id"]
    await broker.runs.wait(run_id)
    events = [e for e in broker.store.events_since(0) if e.run_id == run_id]
    text = "".join(e.data.get("text", "") for e in events if e.type == EventType.TEXT_DELTA)
    return [e.type for e in events if e.type in TERMINAL_EVENTS][0], text


async def refused(broker: Broker, **params) -> Refusal:
    with pytest.raises(Refusal) as info:
        await call_method(broker, A, "run.start", {"conversation": "cell-1", "prompt": "hi", **params})
    return info.value


@pytest.mark.asyncio
async def test_a_profile_run_reaches_the_profiles_upstream_with_its_key(upstreams) -> None:
    broker, default, team, local = upstreams
    grant(broker, {"team", "local"})
    assert await run(broker, profile="team") == (EventType.DONE, "from team")
    # the team fake accepts only the team key: the answer proves the key; nothing reached the default
    assert len(team.requests) == 1 and not default.requests and not local.requests
    assert DEFAULT_KEY not in json.dumps(team.requests[0].headers)
    # an OpenAI-compatible profile: its wire is chosen from its URL, its key from the secrets file
    assert await run(broker, profile="local", model=GPT) == (EventType.DONE, "from local")
    assert len(local.requests) == 1 and not default.requests
    # without a profile: the broker's own upstream, as before
    assert await run(broker) == (EventType.DONE, "from default")
    assert len(default.requests) == 1 and len(team.requests) == 1
    # the audit (the budget's reservation) and the telemetry rows name the profile
    purposes = [r.arguments.get("purpose") for r in broker.audit.tail(100, origin=A.origin)
                if r.tool.startswith("model:") and r.decision == "allow"]
    assert purposes == ["agent:team", "agent:local", None]
    assert [r.profile for r in broker.telemetry.query(origin=A.origin)] == ["team", "local", None]
    # run.started names the profile (and only when the run has one)
    started = [e.data.get("profile") for e in broker.store.events_since(0) if e.type == EventType.RUN_STARTED]
    assert started == ["team", "local", None]


@pytest.mark.asyncio
async def test_profiles_outside_the_grant_unknown_or_wrong_are_refused_before_any_request(upstreams) -> None:
    broker, default, team, local = upstreams
    grant(broker, {"team"})
    exc = await refused(broker, profile="other")
    assert exc.code.value == "SCOPE_EXCEEDED" and "'other' is not in this notebook's grant" in exc.message
    denied = [r for r in broker.audit.tail(100, origin=A.origin) if r.tool == "profile:other"]
    assert [(r.decision, r.code) for r in denied] == [("deny", "SCOPE_EXCEEDED")]
    exc = await refused(broker, profile="nosuch")
    assert exc.code.value == "NOT_FOUND" and "jupyter relay profiles list" in exc.message
    assert "\n" not in exc.message
    # the profile has no OpenAI URL
    exc = await refused(broker, profile="team", backend="openai")
    assert exc.code.value == "CONFIG_INVALID" and "openai_base_url" in exc.message
    grant(broker, {"team", "nokey"}, consent="c1")
    exc = await refused(broker, profile="nokey")  # its key is not in the secrets file: never the default's
    assert exc.code.value == "NO_CREDENTIALS" and "'nokey.anthropic'" in exc.message
    # the claude-code engine takes a profile too (tests/runtime/test_claude_code_profile.py), with the same checks
    exc = await refused(broker, profile="other", engine="claude-code")
    assert exc.code.value == "SCOPE_EXCEEDED" and "'other' is not in this notebook's grant" in exc.message
    exc = await refused(broker, profile="nokey", engine="claude-code")
    assert exc.code.value == "NO_CREDENTIALS" and "'nokey.anthropic'" in exc.message
    # a name outside the pattern is an invalid param (the model's pattern, the same as the configuration's)
    for bad in ("../x", "a b", "x" * 33, ""):
        with pytest.raises(InvalidParams):
            await call_method(broker, A, "run.start", {"conversation": "c", "prompt": "hi", "profile": bad})
    # a grant with '*' covers every profile
    grant(broker, {"*"}, consent="c2")  # widening: a fresh consent
    assert await run(broker, profile="other") == (EventType.DONE, "from team")
    # nothing reached any upstream for the refusals (the one request is the '*' run's)
    assert not default.requests and not local.requests and len(team.requests) == 1
