"""Team admin commands (issue 15 item 6) against a real daemon on SQLite with the fake Anthropic server:

- ``jupyter relay budget set --team`` changes a team's limit without a config edit or a restart: the running
  daemon's next request is refused naming the team, and ``teams list`` shows the new limit;
- ``jupyter relay audit --team/--user --since`` shows the team's members' records and not others';
- ``jupyter relay teams spend`` (SQLite too) gives spend per user and per team, ``--plot`` a PNG; the same rows
  as a DataFrame and a plot from ``relay_jupyter.cli.teams`` (what a notebook calls);
- bad input is one line, exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.testing import FakeAnthropic, Reply, Usage, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_harness import Daemon, run_cli, start_daemon, wait_for  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "sk-ant-test-team-admin-0123456789"


def _rpc(daemon: Daemon, method: str, params: dict) -> dict:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        return conn.rpc(method, params, {"X-Relay-Client": "nb"})
    finally:
        conn.close()


def _run(daemon: Daemon, prompt: str) -> dict:
    reply = _rpc(daemon, "run.start", {"conversation": "c1", "prompt": prompt})
    assert "error" not in reply, reply
    run_id = reply["result"]["run_id"]
    wait_for(lambda: _rpc(daemon, "runs.get", {"run_id": run_id})["result"]["run"]["state"] != "running",
             timeout=60, what="the run to end")
    return _rpc(daemon, "runs.get", {"run_id": run_id})["result"]["run"]


def test_budget_set_audit_and_spend_for_a_team(tmp_path: Path) -> None:
    root = tmp_path
    ensure_private_dir(root / "sock")
    cfg = root / "broker.json"
    with FakeAnthropic(api_key=KEY) as fake:
        cfg.write_text(json.dumps({
            "data_dir": str(root / "relay"), "anthropic_base_url": fake.base_url, "anthropic_api_key": KEY,
            "default_model": "claude-test-1", "user": "alice",
            "teams": {"ml": {"members": ["alice", "bob"], "tokens_per_day": 10**9}, "ops": {"members": ["carol"]}}}))
        daemon = start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock", "--config", str(cfg))
        try:
            assert _rpc(daemon, "grants.create", {"tools": ["*"], "models": ["*"],
                                                  "budget": {"tokens_per_day": None, "cost_per_day_usd": None}}).get("result")
            fake.enqueue(Reply(text("first"), usage=Usage(input_tokens=600, output_tokens=400)))
            assert _run(daemon, "first question")["state"] == "done"
            # a new day limit for the team, from the terminal, while the daemon runs
            out = run_cli(root, "budget", "set", "--team", "ml", "--tokens-per-day", "1500", "--config", str(cfg))
            assert out.returncode == 0, out.stderr
            assert "team ml" in out.stdout and "tokens_per_day 1500" in out.stdout
            refused = _run(daemon, "second question")
            assert refused["state"] == "budget_exhausted", refused
            listed = json.loads(run_cli(root, "teams", "list", "--json", "--config", str(cfg)).stdout)
            ml = next(t for t in listed if t["team"] == "ml")
            assert ml["day"]["tokens_limit"] == 1500 and ml["day"]["tokens"] == 1000
            # a larger limit again: the next run goes through
            assert run_cli(root, "budget", "set", "--team", "ml", "--tokens-per-day", str(10**9),
                           "--config", str(cfg)).returncode == 0
            fake.enqueue(Reply(text("third"), usage=Usage(input_tokens=10, output_tokens=10)))
            assert _run(daemon, "third question")["state"] == "done"
            # 'none': no limit on that axis
            assert run_cli(root, "budget", "set", "--team", "ops", "--tokens-per-day", "none", "--cost-per-month",
                           "12.5", "--config", str(cfg)).returncode == 0
            listed = json.loads(run_cli(root, "teams", "list", "--json", "--config", str(cfg)).stdout)
            ops = next(t for t in listed if t["team"] == "ops")
            assert ops["day"]["tokens_limit"] is None and ops["month"]["cost_limit"] == 12.5
        finally:
            daemon.stop()
    # audit of the team (alice is the daemon's user) and of a user outside it
    out = run_cli(root, "audit", "--team", "ml", "--since", "1d", "--json", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows and {r["origin"] for r in rows} == {"daemon:nb"}
    assert any(r["tool"] == "grant.create" for r in rows)
    assert json.loads(run_cli(root, "audit", "--team", "ops", "--json", "--config", str(cfg)).stdout) == []
    assert json.loads(run_cli(root, "audit", "--user", "bob", "--json", "--config", str(cfg)).stdout) == []
    future = run_cli(root, "audit", "--team", "ml", "--since", "2999-01-01", "--json", "--config", str(cfg))
    assert json.loads(future.stdout) == []
    # spend per user and per team (SQLite), and its plot
    png = root / "spend.png"
    out = run_cli(root, "teams", "spend", "--json", "--plot", str(png), "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    spend = json.loads(out.stdout[out.stdout.index("["):])
    users = [r for r in spend if r["user"] == "alice"]
    teams = [r for r in spend if r["team"] == "ml"]
    assert len(users) == 1 and len(teams) == 1
    assert users[0]["tokens"] == teams[0]["tokens"] == 1020
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same view from Python, as a notebook would
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.cli.teams import spend_frame, spend_plot, spend_rows

    frame = spend_frame(spend_rows(BrokerConfig.model_validate(json.loads(cfg.read_text()))))
    assert list(frame.columns) == ["day", "user", "team", "tokens", "cost_usd"]
    assert int(frame[frame["user"] == "alice"]["tokens"].sum()) == 1020
    ax = spend_plot(frame, by="team")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ml"]


@pytest.mark.parametrize("args, needle", [
    (("budget", "set", "--team", "nope", "--tokens-per-day", "5"), "no team 'nope'"),
    (("budget", "set", "--team", "ml", "--tokens-per-day", "-5"), "--tokens-per-day"),
    (("budget", "set", "--team", "ml", "--cost-per-day", "lots"), "--cost-per-day"),
    (("budget", "set", "--team", "ml"), "at least one of"),
    (("audit", "--since", "yesterday"), "--since"),
    (("audit", "--team", "nope"), "no team 'nope'"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args, needle) -> None:
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "relay"), "teams": {"ml": {"members": ["alice"]}}}))
    out = run_cli(tmp_path, *args, "--config", str(cfg))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_a_malformed_limits_file_leaves_the_configured_limits(tmp_path: Path) -> None:
    from relay_jupyter.core.teams import Teams
    from relay_jupyter.storage.team_limits import TeamLimitsFile, write_team_limits

    base = Teams.from_config({"ml": {"members": ["alice"], "tokens_per_day": 100}})
    path = tmp_path / "team_budgets.json"
    source = TeamLimitsFile(base, path)
    assert source.teams().get("ml").budget.tokens_per_day == 100  # no file
    write_team_limits(path, {"ml": {"tokens_per_day": 7}, "unknown": {"tokens_per_day": 1}})
    assert source.teams().get("ml").budget.tokens_per_day == 7 and source.teams().get("unknown") is None
    path.write_text('{"ml": {"tokens_per_day": -1}}')
    assert source.teams().get("ml").budget.tokens_per_day == 100
    path.write_text("not json")
    assert source.teams().get("ml").budget.tokens_per_day == 100
