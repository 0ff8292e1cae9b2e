"""``%%agent --profile NAME`` end to end: a real Jupyter server with the relay extension, a real kernel, and two
shipped fake Anthropic upstreams (each refusing any key but its own): the server's default and the ``team``
profile (``c.RelayApp.profiles``, its key in the 0600 secrets file).

Proves: the flag reaches ``run.start``; the run's requests go to the profile's upstream with its key, not the
default's; a profile outside the grant and a bad name fail the cell with one line (no traceback) and send
nothing upstream.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import Reply

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow

DEFAULT_KEY = "sk-ant-default-key-0123456789abcdef"
TEAM_KEY = "sk-ant-team-key-fedcba9876543210"
MODEL = "claude-test-1"



def _one_line(msgs: list[dict[str, Any]]) -> str:
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "Traceback" not in tb[0], tb
    return tb[0]


def test_agent_profile_flag_runs_over_the_profiles_upstream(tmp_path) -> None:
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": TEAM_KEY, "other.anthropic": TEAM_KEY}))
    secrets.chmod(0o600)
    with FakeAnthropic(api_key=DEFAULT_KEY, models=(MODEL,), default=Reply("from default")) as default, \
            FakeAnthropic(api_key=TEAM_KEY, models=(MODEL,), default=Reply("from team")) as team, \
            RealServer(tmp_path, relay_config={
                "anthropic_api_key": DEFAULT_KEY, "anthropic_base_url": default.base_url, "default_model": MODEL,
                "secrets_file": str(secrets), "profiles": {"team": {"anthropic_base_url": team.base_url},
                                                           "other": {"anthropic_base_url": team.base_url}}}) as srv:
        kc = srv.kernel_for("profiles.ipynb")
        _, msgs = execute(kc, "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL'])")
        credential = text_of(msgs).split()[0]
        assert "result" in srv.kernel_rpc(credential, "grants.create",
                                {"tools": [], "models": [MODEL], "profiles": ["team"]})
        assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"

        reply, msgs = execute(kc, "%%agent --profile team\nsay hi", timeout=60)
        assert reply["status"] == "ok", text_of(msgs)
        assert "from team" in text_of(msgs) and "from default" not in text_of(msgs)
        assert len(team.requests) == 1 and not default.requests  # the team fake takes only the team key

        reply, msgs = execute(kc, "%%agent --profile other\nsay hi", timeout=60)
        assert reply["status"] == "error"
        assert "'other' is not in this notebook's grant" in _one_line(msgs)

        reply, msgs = execute(kc, "%%agent --profile ../etc\nsay hi", timeout=60)
        assert reply["status"] == "error"
        assert "--profile '../etc' is not a profile name" in _one_line(msgs)

        reply, msgs = execute(kc, "%%agent\nsay hi", timeout=60)  # no flag: the server's own upstream
        assert reply["status"] == "ok" and "from default" in text_of(msgs), text_of(msgs)
        assert len(team.requests) == 1 and len(default.requests) == 1
