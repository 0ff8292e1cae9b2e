"""Team budgets (core/teams.py + core/budgets.py): members' notebooks draw from one team budget, day
and month, reserved together with the notebook's own limits (the tightest wins, a refusal holds
nothing), on the in-memory ledger (no transaction: holds released on a refusal) and on the SQLite
store (one transaction). The same over PostgreSQL across processes: tests/pg/test_pg_concurrency.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from core_support import FakeClock

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.errors import Code, GateRefusal
from relay_jupyter.core.memory import MemoryLedger
from relay_jupyter.core.teams import Team, TeamBudget, Teams, team_key, user_of_origin
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage import Store

DAY1 = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()


def grant(origin: str, **budget) -> Grant:
    return Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c",
                 budget=Budget(**{"requests_per_minute": None, "tokens_per_day": 10_000, "cost_per_day_usd": 100.0,
                                  **budget}))


TEAMS = Teams.from_config({"ml": {"members": ["alice", "bob"], "tokens_per_day": 1000, "tokens_per_month": 1500,
                                  "cost_per_day_usd": 1.0}})


def teams_for(origin: str) -> list[Team]:
    return TEAMS.of_user(user_of_origin(origin, None))


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request, tmp_path: Path):
    if request.param == "memory":
        yield MemoryLedger(), None
        return
    store = Store.open(tmp_path / "relay.db")
    yield store, store.transaction
    store.close()


def book(ledger, clock) -> BudgetLedger:
    port, transaction = ledger
    return BudgetLedger(port, clock=clock, teams_for=teams_for, transaction=transaction)


ALICE = "user:alice/notebook:a.ipynb"
BOB = "user:bob/notebook:b.ipynb"
CAROL = "user:carol/notebook:c.ipynb"


def test_members_share_the_team_day_budget_and_the_tightest_limit_wins(ledger) -> None:
    clock = FakeClock(DAY1)
    b = book(ledger, clock)
    port = ledger[0]
    r1 = b.reserve(ALICE, grant(ALICE), tokens=600, cost_usd=0.1)
    # bob's own grant allows 10k, but the team has 400 left while alice's request is in flight
    with pytest.raises(GateRefusal) as refused:
        b.reserve(BOB, grant(BOB), tokens=500, cost_usd=0.1)
    assert refused.value.code == Code.BUDGET_EXCEEDED
    assert refused.value.data["team"] == "ml" and refused.value.data["limit"] == "team_tokens_per_day"
    assert "team ml's daily token budget of 1000" in refused.value.message
    # the refusal held nothing: not on bob's notebook, not on the team
    assert port.held(BOB, "2026-12-01") == (0, 0.0)
    assert port.held(team_key("ml"), "2026-12-01") == (600, pytest.approx(0.1))
    r1.settle(300, 0.05)
    # alice's spend reduces bob's remaining
    [row] = b.usage(BOB, grant(BOB))["teams"]
    assert row["team"] == "ml" and row["day"]["tokens"] == 300 and row["remaining_tokens"] == 700
    assert port.usage(ALICE, "2026-12-01") == (300, pytest.approx(0.05))
    assert port.usage(team_key("ml"), "2026-12-01") == (300, pytest.approx(0.05))
    assert port.usage(team_key("ml"), "2026-12") == (300, pytest.approx(0.05))
    r2 = b.reserve(BOB, grant(BOB), tokens=500, cost_usd=0.1)
    r2.settle(500, 0.1)
    # the notebook's own limit is tighter than the team's: it refuses, and holds nothing on the team
    with pytest.raises(GateRefusal) as refused:
        b.reserve(BOB, grant(BOB, tokens_per_day=600), tokens=150, cost_usd=0.0)
    assert refused.value.data["limit"] == "tokens_per_day"
    assert port.held(team_key("ml"), "2026-12-01") == (0, 0.0)
    # a user in no team is limited only by the grant
    b.reserve(CAROL, grant(CAROL), tokens=5000, cost_usd=0.1).settle(5000, 0.1)
    assert b.usage(CAROL, grant(CAROL))["teams"] == []


def test_the_month_budget_spans_days(ledger) -> None:
    clock = FakeClock(DAY1)
    b = book(ledger, clock)
    b.reserve(ALICE, grant(ALICE), tokens=900, cost_usd=0.0).settle(900, 0.0)
    clock.advance(86400)  # the next day: the day budget is fresh, the month has 600 left
    with pytest.raises(GateRefusal) as refused:
        b.reserve(BOB, grant(BOB), tokens=700, cost_usd=0.0)
    assert refused.value.data == {"limit": "team_tokens_per_month", "team": "ml", "month": "2026-12"}
    b.reserve(BOB, grant(BOB), tokens=600, cost_usd=0.0).settle(550, 0.0)
    [row] = b.team_usage(BOB)
    assert row["day"]["tokens"] == 550 and row["month"]["tokens"] == 1450 and row["remaining_tokens"] == 50


def test_release_and_expiry_cover_every_hold_of_a_reservation(ledger) -> None:
    clock = FakeClock(DAY1)
    port = ledger[0]
    b = book(ledger, clock)
    b.reserve(ALICE, grant(ALICE), tokens=400, cost_usd=0.2).release()
    assert port.usage(team_key("ml"), "2026-12-01") == (0, 0.0)
    assert port.held(team_key("ml"), "2026-12") == (0, 0.0)
    b.reserve(ALICE, grant(ALICE), tokens=400, cost_usd=0.2)  # never settled: its broker "died"
    clock.advance(3600)
    b.reserve(BOB, grant(BOB), tokens=10, cost_usd=0.0).release()  # the next reservation charges it in full
    assert port.usage(team_key("ml"), "2026-12-01") == (400, pytest.approx(0.2))
    assert port.usage(team_key("ml"), "2026-12") == (400, pytest.approx(0.2))
    assert port.usage(ALICE, "2026-12-01") == (400, pytest.approx(0.2))


def test_team_config_is_checked_in_one_line() -> None:
    for bad, word in [({"ml": {"members": "alice"}}, "members"),
                      ({"ml": {"members": ["a"], "tokens_per_day": -1}}, "tokens_per_day"),
                      ({"ml": {"members": ["a"], "tokens_per_week": 5}}, "tokens_per_week"),
                      ({"m l": {"members": ["a"]}}, "team name"),
                      ({"ml": {"members": ["a/b"]}}, "user name"),
                      ({"ml": {"members": ["a"], "cost_per_day_usd": float("nan")}}, "cost_per_day_usd"),
                      ({"ml": ["alice"]}, "dict")]:
        with pytest.raises(ValueError) as refused:
            Teams.from_config(bad)
        message = str(refused.value)
        assert "\n" not in message and word in message, message
    teams = Teams.from_config({"b": {"members": ["x"]}, "a": {"members": ["x", "y"], "tokens_per_day": 5}})
    assert [t.name for t in teams.of_user("x")] == ["a", "b"] and teams.of_user("nobody") == []
    narrowed = teams.with_budget("a", TeamBudget(tokens_per_day=1))
    assert narrowed.get("a").budget.tokens_per_day == 1 and teams.get("a").budget.tokens_per_day == 5  # type: ignore[union-attr]


def test_user_of_origin() -> None:
    assert user_of_origin("user:alice/notebook:a.ipynb", "me") == "alice"
    assert user_of_origin("notebook:a.ipynb", "me") == "me"
    assert user_of_origin("user:/notebook:a.ipynb", "me") == "me"
    assert user_of_origin("kernel:anon-1", None) is None
