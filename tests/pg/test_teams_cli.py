"""``jupyter relay teams list``: the teams of the broker settings with what they spent, read from the store
those settings name (PostgreSQL: the rows every user's broker shares; SQLite: the data dir's file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.budgets import BudgetLedger, utc_day
from relay_jupyter.core.teams import Teams, teams_for_origin
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage import Store

TEAMS = {"ml": {"members": ["alice", "bob"], "tokens_per_day": 5000, "cost_per_month_usd": 10}}


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "cfg"), "JUPYTER_DATA_DIR": str(tmp / "data")}
    return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "teams", "list", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _spend(store, user: str, tokens: int, cost: float) -> None:
    origin = f"user:{user}/notebook:a.ipynb"
    ledger = BudgetLedger(store, teams_for=teams_for_origin(Teams.from_config(TEAMS), None))
    grant = Grant(origin=origin, consent_id="c", budget=Budget(requests_per_minute=None))
    ledger.reserve(origin, grant, tokens=tokens, cost_usd=cost).settle(tokens, cost)


@pytest.mark.pg
def test_teams_list_reads_the_shared_database(postgres_db, tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    from relay_jupyter.storage.postgres import PostgresStore

    url, pw = postgres_db
    for user, tokens in (("alice", 1200), ("bob", 300)):
        with PostgresStore.open(url, password_file=pw, namespace=user) as store:
            _spend(store, user, tokens, 0.5)
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"store_url": url, "store_password_file": str(pw), "teams": TEAMS, "user": "carol"}))
    done = _cli(tmp_path, "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    day = utc_day(__import__("time").time())
    assert row["team"] == "ml" and row["members"] == ["alice", "bob"]
    assert row["day"] == {"key": day, "tokens": 1500, "cost_usd": 1.0, "reserved_tokens": 0, "reserved_cost_usd": 0.0,
                          "tokens_limit": 5000, "cost_limit": None}
    assert row["month"]["cost_usd"] == 1.0 and row["month"]["cost_limit"] == 10
    text = _cli(tmp_path, "--config", str(cfg))
    assert text.returncode == 0 and "1500 / 5000 tokens" in text.stdout and "1 / 10 USD" in text.stdout
    assert pw.read_text().strip() not in text.stdout + text.stderr


def test_teams_list_on_the_sqlite_store_and_its_one_line_errors(tmp_path: Path) -> None:
    data = tmp_path / "relay"
    with Store.open(data / "relay.db") as store:
        _spend(store, "alice", 700, 0.25)
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"data_dir": str(data), "teams": TEAMS}))
    done = _cli(tmp_path, "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert "ml: alice, bob" in done.stdout and "700 / 5000 tokens" in done.stdout
    cfg.write_text(json.dumps({"data_dir": str(data)}))
    done = _cli(tmp_path, "--config", str(cfg))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no teams are configured" in done.stderr
    cfg.write_text(json.dumps({"data_dir": str(data), "teams": {"ml": {"members": ["a"], "tokens_per_year": 1}}}))
    done = _cli(tmp_path, "--config", str(cfg))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "tokens_per_year" in done.stderr


@pytest.mark.pg
def test_spend_per_user_and_team(postgres_db, tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    from relay_jupyter.cli.teams import spend_frame
    from relay_jupyter.storage.postgres import PostgresStore

    url, pw = postgres_db
    for user, tokens in (("alice", 1200), ("bob", 300), ("alice", 100)):
        with PostgresStore.open(url, password_file=pw, namespace=user) as store:
            _spend(store, user, tokens, 0.5)
    with PostgresStore.open(url, password_file=pw, namespace="alice") as store:
        store.add_usage("notebook:other.ipynb", "2020-01-01", 5, 0.0)  # an old day, before --since
        rows = store.spend_rows()
        day = utc_day(store.now())
        recent = store.spend_rows(day)
    assert {(r["user"], r["team"], r["day"], r["tokens"]) for r in recent} == {
        ("alice", None, day, 1300), ("bob", None, day, 300), (None, "ml", day, 1600)}
    assert ("alice", None, "2020-01-01", 5) in {(r["user"], r["team"], r["day"], r["tokens"]) for r in rows}
    frame = spend_frame(recent)
    assert list(frame.columns) == ["day", "user", "team", "tokens", "cost_usd"]
    assert int(frame[frame.user == "alice"].tokens.sum()) == 1300
    cfg = tmp_path / "broker.json"
    cfg.write_text(json.dumps({"store_url": url, "store_password_file": str(pw), "teams": TEAMS, "user": "carol"}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "teams", "spend", "--config", str(cfg),
                           "--since", day], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"{day}  user alice: 1300 tokens" in done.stdout and f"{day}  team ml: 1600 tokens" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "teams", "spend", "--config", str(cfg),
                          "--since", "yesterday"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.pg
def test_budget_set_on_one_broker_holds_for_every_broker_on_the_database(postgres_db, tmp_path: Path) -> None:
    """Per-user brokers sharing PostgreSQL (issue 15 deployment 2) read a team's limits from the database,
    never from their own files: alice's old team_budgets.json seeds the table (the first broker's file
    wins), bob's disagreeing file is not read, and ``jupyter relay budget set --team`` run with bob's
    settings changes the limit both brokers reserve against, from their next request on."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.core.errors import Refusal
    from relay_jupyter.storage.postgres import PostgresStore
    from relay_jupyter.storage.team_limits import TEAM_LIMITS_FILE, team_limits_source, write_team_limits

    url, pw = postgres_db
    base = Teams.from_config(TEAMS)
    brokers = {}
    for user, file_limit in (("alice", 10**9), ("bob", 7)):
        data = tmp_path / user
        data.mkdir(mode=0o700)
        write_team_limits(data / TEAM_LIMITS_FILE, {"ml": {"tokens_per_day": file_limit}})
        config = BrokerConfig.model_validate({"store_url": url, "store_password_file": str(pw), "data_dir": str(data),
                                              "teams": TEAMS, "user": user})
        store = PostgresStore.open(url, password_file=pw, namespace=user)
        brokers[user] = (store, team_limits_source(base, store, config), config)
    try:
        limits = {u: src().get("ml").budget.tokens_per_day for u, (_, src, _) in brokers.items()}
        assert limits == {"alice": 10**9, "bob": 10**9}  # one limit, alice's file seeded it; bob's 7 never holds
        cfg = tmp_path / "bob.json"
        cfg.write_text(brokers["bob"][2].model_dump_json())
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
        done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "budget", "set", "--team", "ml",
                               "--tokens-per-day", "1500", "--config", str(cfg)], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "tokens_per_day 1500" in done.stdout and pw.read_text().strip() not in done.stdout + done.stderr
        # the limit both brokers now reserve against (the seeded row replaced the configured budget whole,
        # as the file did: its other axes have no limit)
        for _, src, _ in brokers.values():
            assert src().get("ml").budget.model_dump() == {"tokens_per_day": 1500, "cost_per_day_usd": None,
                                                           "tokens_per_month": None, "cost_per_month_usd": None}

        def ledger(user: str) -> BudgetLedger:
            store, src, _ = brokers[user]
            return BudgetLedger(store, teams_for=teams_for_origin(src, user), transaction=store.transaction)

        grant = Grant(origin="notebook:a.ipynb", consent_id="c", budget=Budget(requests_per_minute=None))
        ledger("alice").reserve("notebook:a.ipynb", grant, tokens=1000, cost_usd=0.1).settle(1000, 0.1)
        with pytest.raises(Refusal) as refused:  # bob's broker: his own notebook is fine, the team is not
            ledger("bob").reserve("notebook:a.ipynb", grant, tokens=600, cost_usd=0.1)
        assert "ml" in refused.value.message
        ledger("bob").reserve("notebook:a.ipynb", grant, tokens=500, cost_usd=0.1).settle(500, 0.1)
        assert brokers["alice"][0].usage("team:ml", utc_day(__import__("time").time())) == (1500, pytest.approx(0.2))
    finally:
        for store, _, _ in brokers.values():
            store.close()
