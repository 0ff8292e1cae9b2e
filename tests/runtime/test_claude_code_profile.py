"""``%%agent --engine claude-code --profile NAME`` (issue 16 item 6): the CLI's model requests go through relay's
endpoint, as always, and from there to the profile's Anthropic upstream with the profile's key from the secrets
file — never to the broker's default upstream, never with its key — whatever profile header the CLI's requests
carry; ``run.started`` names the profile; the audit names ``proxy:<profile>``.

Two shipped fake Anthropic servers, each accepting only its own key; the REAL bundled ``claude`` CLI; ``peer``,
only inside ``unshare -n``.
"""

from __future__ import annotations

import json

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

from .claude_code_rig import KEY, MODEL, NB, ONLY_ISOLATED, close, events, terminal, terminal_data, workspace

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]

TEAM_KEY = "sk-ant-team-profile-key-9876543210"


async def test_a_claude_code_run_with_a_profile_reaches_only_the_profiles_upstream(tmp_path):
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": TEAM_KEY}))
    secrets.chmod(0o600)
    root = tmp_path / "root"
    root.mkdir()
    with FakeAnthropic(api_key=KEY, default=Reply("from default")) as default, \
            FakeAnthropic(api_key=TEAM_KEY, default=Reply("(team) nothing scripted")) as team:
        broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                          anthropic_base_url=default.base_url, default_model=MODEL,
                                          default_engine="claude-code", secrets_file=secrets,
                                          profiles={"team": {"anthropic_base_url": team.base_url}}))
        broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  profiles=frozenset({"team"}), consent_id="t"))
        install_components(broker, jupyter_root=root)
        try:
            ws = workspace(broker, "p1")
            (ws / "a.txt").write_text("team data\n")
            team.enqueue(Reply(tool_use("Read", {"file_path": str(ws / "a.txt")})), Reply("It says team data."))
            run_id = (await call_method(broker, NB, "run.start", {"conversation": "p1", "prompt": "read a.txt",
                                                                  "profile": "team"}))["run_id"]
            assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
            # the team fake takes only the team key: both requests reached it with that key; none the default
            assert len(team.requests) == 2 and default.requests == []
            assert team.saw_api_key(TEAM_KEY) and not team.saw_api_key(KEY)
            (started,) = events(broker, run_id, EventType.RUN_STARTED)
            assert started.data["profile"] == "team" and started.data["engine"] == "claude-code"
            allowed = [r for r in broker.audit.tail(1000, origin=NB.origin)
                       if r.tool == f"model:{MODEL}" and r.decision == "allow"]
            assert [r.arguments.get("purpose") for r in allowed] == ["proxy:team", "proxy:team"]
            assert "team data" in "".join(e.data["text"] for e in events(broker, run_id, EventType.TEXT_DELTA))

            # the next run without a profile: the broker's own upstream, as before
            before = len(team.requests)
            run_id = (await call_method(broker, NB, "run.start", {"conversation": "p2", "prompt": "hi"}))["run_id"]
            assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
            assert len(default.requests) == 1 and len(team.requests) == before
            assert "profile" not in events(broker, run_id, EventType.RUN_STARTED)[0].data
        finally:
            await close(broker)
            broker.close()
