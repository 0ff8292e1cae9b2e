"""Pricing: per-million rates, longest-prefix match, unknown models priced at the worst rate."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from relay_jupyter.core.pricing import DEFAULT_PRICES, Pricing
from relay_jupyter.core.types import Usage


def test_cost_uses_all_four_rates():
    p = Pricing()
    u = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cache_creation_input_tokens=1_000_000,
              cache_read_input_tokens=1_000_000)
    assert math.isclose(p.cost("claude-sonnet-4", u), 3.0 + 15.0 + 3.75 + 0.3)


def test_longest_prefix_wins():
    p = Pricing()
    assert p.price("claude-opus-4-5-20251101").input == 5.0
    assert p.price("claude-opus-4-1-20250805").input == 15.0
    assert p.known("claude-sonnet-4-5-20250929")


def test_unknown_model_is_priced_at_the_most_expensive_rates():
    p = Pricing()
    worst_out = max(r["output"] for r in DEFAULT_PRICES.values())
    assert not p.known("llama3.1:8b")
    assert p.price("llama3.1:8b").output == worst_out
    assert p.cost("llama3.1:8b", Usage(output_tokens=1_000_000)) == worst_out
    for model in DEFAULT_PRICES:
        assert p.estimate("llama3.1:8b", 1000) >= p.estimate(model, 1000)


def test_estimate_is_the_worst_case():
    p = Pricing()
    assert math.isclose(p.estimate("claude-sonnet-4", 1_000_000), 15.0)
    u = Usage(input_tokens=300, output_tokens=700)
    assert p.cost("claude-sonnet-4", u) <= p.estimate("claude-sonnet-4", u.total)


def test_override_merges_over_defaults():
    p = Pricing({"claude-sonnet-4": {"output": 20.0}, "llama3": {"input": 0, "output": 0}})
    assert p.price("claude-sonnet-4").output == 20.0 and p.price("claude-sonnet-4").input == 3.0
    assert p.cost("llama3.1:8b", Usage(input_tokens=10**6, output_tokens=10**6)) == 0.0
    assert p.table()["llama3"] == {"input": 0.0, "output": 0.0, "cache_write": 0.0, "cache_read": 0.0}


def test_new_model_gets_derived_cache_rates():
    p = Pricing({"my-model": {"input": 2.0, "output": 4.0}})
    assert p.price("my-model").cache_write == 2.5 and math.isclose(p.price("my-model").cache_read, 0.2)


@pytest.mark.parametrize("table", [
    {"m": {"input": -1, "output": 1}},
    {"m": {"input": float("nan"), "output": 1}},
    {"m": {"input": float("inf"), "output": 1}},
    {"m": {"input": "cheap", "output": 1}},
    {"m": {"output": 1}},  # new model without input
    {"claude-sonnet-4": {"surge": 2.0}},  # unknown rate name
])
def test_bad_tables_are_validation_errors(table):
    with pytest.raises(ValidationError):
        Pricing(table)


@pytest.mark.parametrize("table", [["m"], {"m": 3}, {"": {"input": 1, "output": 1}}])
def test_bad_table_shapes_are_type_errors(table):
    with pytest.raises(TypeError):
        Pricing(table)  # type: ignore[arg-type]


def test_bad_arguments():
    p = Pricing()
    with pytest.raises(ValueError):
        p.estimate("claude-sonnet-4", -1)
    with pytest.raises(TypeError):
        p.cost("claude-sonnet-4", {"input_tokens": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.price(None)  # type: ignore[arg-type]


def test_bound_is_never_below_the_cost_of_usage_of_that_shape():
    from relay_jupyter.core.types import Usage

    p = Pricing()
    for model in ("claude-sonnet-4-5", "claude-opus-4-5", "mystery-model"):
        bound = p.bound(model, 400, 100)
        for usage in (Usage(input_tokens=400, output_tokens=100),
                      Usage(cache_creation_input_tokens=400, output_tokens=100),
                      Usage(cache_read_input_tokens=300, input_tokens=100, output_tokens=100)):
            assert p.cost(model, usage) <= bound + 1e-12
        assert bound <= p.estimate(model, 500) + 1e-12  # tighter than every token at the top rate
    with pytest.raises(ValueError):
        p.bound("claude-sonnet-4-5", -1, 0)
