"""``jupyter relay grants``: issued at the terminal into the store, seen by a running daemon."""

from __future__ import annotations

import json
import time

import pytest
from daemon_harness import run_cli, wait_for

from relay_jupyter.cli import main
from relay_jupyter.cli.grants import parse_budget, parse_duration, parse_list
from relay_jupyter.core.errors import ConfigRefusal
from relay_jupyter.core.types import Budget
from relay_jupyter.storage.audit_log import read_audit_file


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    return tmp_path


def test_add_list_revoke_without_a_daemon(here, capsys):
    assert main(["grants", "add", "notebook:a.ipynb", "--tools", "list_variables,read_file", "--models",
                 "claude-sonnet-4-5", "--budget", "tokens=1000,cost=0.5,rpm=10,steps=none", "--expires", "7d"]) == 0
    out = capsys.readouterr().out
    assert "granted notebook:a.ipynb" in out and "consent: terminal:" in out
    assert main(["grants", "list", "--json"]) == 0
    grants = json.loads(capsys.readouterr().out)["grants"]
    assert len(grants) == 1
    g = grants[0]
    assert g["origin"] == "notebook:a.ipynb" and sorted(g["tools"]) == ["list_variables", "read_file"]
    assert g["budget"]["tokens_per_day"] == 1000 and g["budget"]["cost_per_day_usd"] == 0.5
    assert g["budget"]["requests_per_minute"] == 10 and g["budget"]["max_steps_per_run"] is None
    assert g["budget"]["max_tokens_per_run"] == Budget().max_tokens_per_run  # unset keys keep defaults
    assert abs(g["expires_at"] - (time.time() + 7 * 86_400)) < 60
    assert g["consent_id"].startswith("terminal:")
    # a second add is a fresh consent: it may widen
    assert main(["grants", "add", "notebook:a.ipynb", "--tools", "*", "--budget", "tokens=5000"]) == 0
    capsys.readouterr()
    assert main(["grants", "revoke", "notebook:a.ipynb"]) == 0
    assert "revoked the grant of notebook:a.ipynb" in capsys.readouterr().out
    assert main(["grants", "revoke", "notebook:a.ipynb"]) == 0
    assert "had no grant" in capsys.readouterr().out
    assert main(["grants", "list"]) == 0
    assert "no live grants" in capsys.readouterr().out
    actions = [r["tool"] for r in read_audit_file(here / "data" / "relay" / "audit.jsonl")]
    assert actions == ["grant.create", "grant.create", "grant.revoke"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--tools", "a", "--budget", "bogus=1"], "not key=value"),
    (["--tools", "a", "--budget", "tokens=-5"], ">= 0"),
    (["--tools", "a", "--budget", "tokens=1.5"], "whole number"),
    (["--tools", "a", "--budget", "cost=nan"], "finite"),
    (["--tools", "a", "--budget", "cost=inf"], "finite"),
    (["--tools", "a", "--budget", "rpm"], "not key=value"),
    (["--tools", "a", "--expires", "soon"], "not a duration"),
    (["--tools", "a", "--expires", "0d"], "not a duration"),
    (["--tools", ""], "at least one tool"),
    (["--tools", "a b"], "not a valid name"),
    (["--tools", "a", "--models", "x;rm -rf"], "not a valid name"),
])
def test_bad_input_is_one_line_exit_2(here, capsys, args, needle):
    assert main(["grants", "add", "daemon:default", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("origin", ["", "noprefix", "UPPER:x", "daemon:", "daemon:\x1b[31m", "daemon:a\nb"])
def test_bad_origin_refused(here, capsys, origin):
    assert main(["grants", "add", origin, "--tools", "a"]) == 2
    assert "is not an origin" in capsys.readouterr().err


def test_parsers():
    assert parse_duration("90m") == 5400 and parse_duration("2w") == 14 * 86_400 and parse_duration("30") == 30
    assert parse_list(" a, b ,,c", "tools") == frozenset({"a", "b", "c"})
    assert parse_budget("") == Budget()
    assert parse_budget("run_tokens=none").max_tokens_per_run is None
    with pytest.raises(ConfigRefusal):
        parse_budget("tokens=1e400")


def test_grant_from_terminal_is_seen_by_a_running_daemon(unix_daemon):
    headers = {"X-Relay-Client": "terminal-test"}
    conn = unix_daemon.connect()
    try:
        assert conn.rpc("grants.get", {}, headers)["result"] == {"grant": None}
        done = run_cli(unix_daemon.root, "grants", "add", "daemon:terminal-test", "--tools", "list_variables",
                       "--models", "m1", "--budget", "tokens=100")
        assert done.returncode == 0, done.stderr
        # the daemon writes its own audit-daemon.jsonl, so the terminal's grant is audited in audit.jsonl
        assert "audit log" not in done.stderr
        records = read_audit_file(unix_daemon.root / "data" / "relay" / "audit.jsonl")
        assert [r["origin"] for r in records if r["tool"] == "grant.create"] == ["daemon:terminal-test"]

        def seen() -> bool:
            return conn.rpc("grants.get", {}, headers)["result"]["grant"] is not None

        wait_for(seen, 10, "the daemon to see the terminal grant")
        grant = conn.rpc("grants.get", {}, headers)["result"]["grant"]
        assert grant["origin"] == "daemon:terminal-test" and grant["tools"] == ["list_variables"]
        assert grant["consent_id"].startswith("terminal:")
        # another client name is another origin: it does not get this grant
        assert conn.rpc("grants.get", {}, {"X-Relay-Client": "other"})["result"] == {"grant": None}
        # and a daemon client cannot name another origin
        other = conn.rpc("grants.get", {"origin": "daemon:terminal-test"}, {"X-Relay-Client": "other"})
        assert other["error"]["data"]["code"] == "UNAUTHORIZED"
        done = run_cli(unix_daemon.root, "grants", "revoke", "daemon:terminal-test")
        assert done.returncode == 0
        wait_for(lambda: not seen(), 10, "the revocation to reach the daemon")
    finally:
        conn.close()
