"""relay.budget() shows the team budgets a notebook draws from (budget.get's usage.teams, issue 15)."""

from __future__ import annotations

from relay_jupyter.kernel.widgets.tables import BudgetMeters, budget_numbers


def test_team_rows_show_what_the_team_has_used_and_holds_against_each_limit() -> None:
    info = {"origin": "notebook:a.ipynb", "usage": {
        "tokens": 100, "cost_usd": 0.01, "tokens_limit": 200_000, "cost_limit": 5.0, "rpm_limit": None,
        "rpm_available": None,
        "teams": [{"team": "ml",
                   "day": {"tokens": 1500, "reserved_tokens": 300, "cost_usd": 0.5, "reserved_cost_usd": 0.0,
                           "tokens_limit": 2000, "cost_limit": None},
                   "month": {"tokens": 9000, "reserved_tokens": 300, "cost_usd": 3.0, "reserved_cost_usd": 0.0,
                             "tokens_limit": None, "cost_limit": 40.0},
                   "remaining_tokens": 200, "remaining_cost_usd": 37.0}]}}
    rows = budget_numbers(info)
    assert rows[3:] == [("team ml tokens today", 1800.0, 2000.0, "tokens"),
                        ("team ml cost this month", 3.0, 40.0, "USD")]
    assert "team ml tokens today: 1800 / 2000 tokens" in BudgetMeters(info).text()
    # no teams (or a broker without any configured): the three rows as before
    assert len(budget_numbers({"usage": {"tokens": 1}})) == 3
    assert len(budget_numbers({"usage": {"teams": ["odd", {"team": "x", "day": "odd"}]}})) == 3
