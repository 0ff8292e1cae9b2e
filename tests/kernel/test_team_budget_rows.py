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


def test_profile_rows_show_each_capped_profiles_day_limits_read_only() -> None:
    # budget.get's usage.profiles (only when the grant has profile_budgets): used plus in flight against each limit
    from relay_jupyter.kernel.widgets.tables import GrantsTable, profile_budget_words

    info = {"usage": {"tokens": 1, "profiles": [
        {"profile": "team", "tokens": 900, "reserved_tokens": 100, "cost_usd": 0.25, "reserved_cost_usd": 0.05,
         "tokens_limit": 1000, "cost_limit": 2.0, "remaining_tokens": 0, "remaining_cost_usd": 1.7},
        {"profile": "lo\u202ecal", "tokens": 3, "tokens_limit": None, "cost_limit": 1.5, "cost_usd": 0.5},
        "odd", {"profile": "x", "tokens_limit": "lots"}]}}
    rows = budget_numbers(info)
    assert rows[3:] == [("profile team tokens today", 1000.0, 1000.0, "tokens"),
                        ("profile team cost today", 0.3, 2.0, "USD"),
                        ("profile lo<U+202E>cal cost today", 0.5, 1.5, "USD")]
    assert "profile team tokens today: 1000 / 1000 tokens" in BudgetMeters(info).text()
    limits = [{"profile": "team", "tokens_per_day": 50_000, "cost_per_day_usd": 10.0}, {"profile": "local"}, 7]
    assert profile_budget_words(limits) == "team: 50,000 tokens/day · $10.00/day; local: no limits"
    assert profile_budget_words(None) == "" and profile_budget_words([]) == ""
    text = GrantsTable([{"origin": "notebook:a.ipynb", "tools": [], "models": [], "budget": {},
                         "profile_budgets": limits[:1]}], lambda o: None).text()  # type: ignore[arg-type,return-value]
    assert text.endswith("profile budgets: team: 50,000 tokens/day · $10.00/day")
    assert "profile budgets" not in GrantsTable([{"origin": "o", "budget": {}}], lambda o: None).text()  # type: ignore
