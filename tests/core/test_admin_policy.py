"""The admin policy (issue 15 item 3): a user's grant can only narrow it. Whatever the grant and the policy,
the effective grant allows nothing the grant does not and nothing the policy does not, on every axis
(tools, models, each budget limit), and applying the policy twice changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_jupyter.core.admin_policy import AdminPolicy, BudgetCeiling
from relay_jupyter.core.grants import widens
from relay_jupyter.core.types import Budget, Grant

NAMES = ["a", "b", "c", "d", "*"]
PROBES = ["a", "b", "c", "d", "zzz"]

names = st.frozensets(st.sampled_from(NAMES), max_size=5)
maybe_names = st.none() | names
limit = st.none() | st.integers(min_value=0, max_value=10**7)
money = st.none() | st.floats(min_value=0, max_value=1e4, allow_nan=False)

budgets = st.builds(Budget, requests_per_minute=money, tokens_per_day=limit, cost_per_day_usd=money,
                    max_steps_per_run=limit, max_tokens_per_run=limit)
ceilings = st.builds(BudgetCeiling, requests_per_minute=money, tokens_per_day=limit, cost_per_day_usd=money,
                     max_steps_per_run=limit, max_tokens_per_run=limit)
grants = st.builds(lambda t, m, b: Grant(origin="user:alice/notebook:a.ipynb", tools=t, models=m, budget=b,
                                         consent_id="c1"), names, names, budgets)
policies = st.builds(lambda t, m, c: AdminPolicy(tools=t, models=m, max_budget=c), maybe_names, maybe_names, ceilings)


def _within(limit_value, ceiling):
    """A limit is within a ceiling: no ceiling, or a finite limit no larger than it."""
    return ceiling is None or (limit_value is not None and limit_value <= ceiling)


@given(grants, policies)
def test_the_effective_grant_is_never_wider_than_the_grant_or_the_policy(grant: Grant, policy: AdminPolicy) -> None:
    eff = policy.narrow(grant)
    assert widens(eff, grant) == []  # never wider than what the user consented to
    assert eff.budget.narrows(grant.budget)
    for name in PROBES:
        if eff.allows_tool(name):
            assert grant.allows_tool(name)
            assert policy.tools is None or "*" in policy.tools or name in policy.tools
        if eff.allows_model(name):
            assert grant.allows_model(name)
            assert policy.models is None or "*" in policy.models or name in policy.models
    for axis in BudgetCeiling.model_fields:
        assert _within(getattr(eff.budget, axis), getattr(policy.max_budget, axis)), axis
    assert policy.narrow(eff) == eff  # idempotent
    assert eff.origin == grant.origin and eff.consent_id == grant.consent_id


@given(grants, policies)
def test_what_both_allow_stays_allowed(grant: Grant, policy: AdminPolicy) -> None:
    eff = policy.narrow(grant)
    for name in PROBES:
        policy_tool = policy.tools is None or "*" in policy.tools or name in policy.tools
        assert eff.allows_tool(name) == (grant.allows_tool(name) and policy_tool)
        policy_model = policy.models is None or "*" in policy.models or name in policy.models
        assert eff.allows_model(name) == (grant.allows_model(name) and policy_model)


def test_a_grant_of_everything_becomes_the_policy() -> None:
    grant = Grant(origin="o", tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c",
                  budget=Budget(tokens_per_day=None, cost_per_day_usd=None))
    policy = AdminPolicy.from_config({"tools": ["list_variables"], "models": ["claude-haiku-4-5"],
                                      "max_budget": {"tokens_per_day": 1000, "cost_per_day_usd": 2}})
    assert policy is not None
    eff = policy.narrow(grant)
    assert eff.tools == {"list_variables"} and eff.models == {"claude-haiku-4-5"}
    assert eff.budget.tokens_per_day == 1000 and eff.budget.cost_per_day_usd == 2
    assert eff.budget.max_steps_per_run == grant.budget.max_steps_per_run  # no ceiling there


def test_modes() -> None:
    policy = AdminPolicy.from_config({"modes": ["ask", "review"]})
    assert policy is not None
    assert policy.allows_mode("ask") and policy.allows_mode("review") and not policy.allows_mode("full")
    assert "full" in (policy.refusal("full") or "") and policy.refusal("ask") is None
    assert not AdminPolicy().allows_mode("yolo")
    assert AdminPolicy().allows_mode("full")


@pytest.mark.parametrize("bad, where", [
    ({"modes": ["ask", "yolo"]}, "modes"),
    ({"tools": "run_code"}, "tools"),
    ({"max_budget": {"tokens_per_day": -1}}, "max_budget.tokens_per_day"),
    ({"max_budget": {"cost_per_day_usd": float("inf")}}, "max_budget.cost_per_day_usd"),
    ({"max_budget": {"tokens": 5}}, "max_budget.tokens"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_policy_is_refused_in_one_line(bad, where) -> None:
    with pytest.raises(ValueError) as err:
        AdminPolicy.from_config(bad)
    message = str(err.value)
    assert message.startswith(f"admin_policy.{where}") and "\n" not in message, message


def test_no_policy() -> None:
    assert AdminPolicy.from_config({}) is None and AdminPolicy.from_config(None) is None
    assert not AdminPolicy().restricts and AdminPolicy(modes=frozenset({"ask"})).restricts
