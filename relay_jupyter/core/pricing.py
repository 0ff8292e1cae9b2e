"""What a model request costs, in USD, from a per-model price table that config can override.

Prices are USD per million tokens for four kinds of token: ``input``, ``output``,
``cache_write`` (Anthropic ``cache_creation_input_tokens``) and ``cache_read``
(``cache_read_input_tokens``). A model id is priced by its exact entry, else by the longest
table key it starts with (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``), else —
fail closed — at the most expensive rates in the table, so an unknown or local model can
never make spend look smaller than it is. Give local models (Ollama, vLLM ...) an explicit
zero-priced entry in config to budget them by tokens only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .types import Usage

__all__ = ["DEFAULT_PRICES", "Price", "Pricing"]

_PER = 1_000_000.0


class Price(BaseModel):
    """Rates of one model, USD per million tokens. Non-negative and finite."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float = Field(ge=0)
    cache_read: float = Field(ge=0)

    @field_validator("input", "output", "cache_write", "cache_read")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("price must be finite")
        return v

    @property
    def worst(self) -> float:
        """The highest of the four rates: what a reservation assumes for every token."""
        return max(self.input, self.output, self.cache_write, self.cache_read)


# Published Anthropic list prices (USD / MTok). Cache write is the 5-minute rate (1.25 × input),
# cache read 0.1 × input. Longest-prefix match picks e.g. "claude-opus-4-5" over "claude-opus-4".
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "claude-opus-4-5": {"input": 5.0, "output": 25.0, "cache_write": 6.25, "cache_read": 0.5},
    "claude-opus-4-6": {"input": 5.0, "output": 25.0, "cache_write": 6.25, "cache_read": 0.5},
    "claude-opus-4": {"input": 15.0, "output": 75.0, "cache_write": 18.75, "cache_read": 1.5},
    "claude-sonnet-4": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3},
    "claude-3-7-sonnet": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3},
    "claude-3-5-sonnet": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0, "cache_write": 1.25, "cache_read": 0.1},
    "claude-3-5-haiku": {"input": 0.8, "output": 4.0, "cache_write": 1.0, "cache_read": 0.08},
    "claude-3-haiku": {"input": 0.25, "output": 1.25, "cache_write": 0.3, "cache_read": 0.03},
}


class Pricing:
    """The price table. ``table`` entries are merged over :data:`DEFAULT_PRICES`.

    An override entry for a known model may give only some rates (the rest are kept); a new
    model needs ``input`` and ``output``, and its cache rates default to 1.25 × and 0.1 × input.

    Raises:
        pydantic.ValidationError: a rate is negative, not finite, not a number, or unknown.
        TypeError: ``table`` or one of its entries is not a mapping.
    """

    def __init__(self, table: Mapping[str, Mapping[str, float]] | None = None) -> None:
        merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in DEFAULT_PRICES.items()}
        if table is not None:
            if not isinstance(table, Mapping):
                raise TypeError("pricing table must be a mapping of model id to rates")
            for model, rates in table.items():
                if not isinstance(model, str) or not model:
                    raise TypeError("pricing table keys must be non-empty model ids")
                if not isinstance(rates, Mapping):
                    raise TypeError(f"pricing entry for {model!r} must be a mapping of rates")
                row = merged.get(model)
                if row is None:
                    row = {}
                    if "input" in rates and "cache_write" not in rates:
                        row["cache_write"] = _num(rates["input"]) * 1.25
                    if "input" in rates and "cache_read" not in rates:
                        row["cache_read"] = _num(rates["input"]) * 0.1
                merged[model] = {**row, **dict(rates)}
        self._prices: dict[str, Price] = {m: Price.model_validate(r) for m, r in merged.items()}
        # prefixes longest first, so the most specific entry wins
        self._prefixes = sorted(self._prices, key=len, reverse=True)
        self._worst = Price(
            input=max(p.input for p in self._prices.values()),
            output=max(p.output for p in self._prices.values()),
            cache_write=max(p.cache_write for p in self._prices.values()),
            cache_read=max(p.cache_read for p in self._prices.values()),
        )
        self._cache: dict[str, Price] = {}

    def price(self, model: str) -> Price:
        """The rates used for ``model`` (exact, longest prefix, else the most expensive known)."""
        if not isinstance(model, str):
            raise TypeError("model must be a str")
        hit = self._cache.get(model)
        if hit is not None:
            return hit
        found = self._prices.get(model)
        if found is None:
            found = next((self._prices[k] for k in self._prefixes if model.startswith(k)), self._worst)
        if len(self._cache) < 4096:  # bounded: model ids come from config and the wire
            self._cache[model] = found
        return found

    def known(self, model: str) -> bool:
        """True when ``model`` has its own entry or a prefix entry (not the fail-closed fallback)."""
        return model in self._prices or any(model.startswith(k) for k in self._prefixes)

    def cost(self, model: str, usage: Usage) -> float:
        """USD cost of one request with ``usage`` tokens."""
        if not isinstance(usage, Usage):
            raise TypeError("usage must be a Usage")
        p = self.price(model)
        return (
            usage.input_tokens * p.input
            + usage.output_tokens * p.output
            + usage.cache_creation_input_tokens * p.cache_write
            + usage.cache_read_input_tokens * p.cache_read
        ) / _PER

    def estimate(self, model: str, tokens: int) -> float:
        """Worst-case USD cost of ``tokens`` tokens of any kind: used to size a reservation.

        Raises:
            ValueError: ``tokens`` is negative or not an int.
        """
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ValueError("tokens must be a non-negative int")
        return tokens * self.price(model).worst / _PER

    def bound(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """Worst-case USD cost of a request of at most ``input_tokens`` in (priced at the highest of the
        input, cache-write and cache-read rates: the server decides which applies) and ``output_tokens``
        out (the output rate). Sizes a reservation from a :class:`~relay_jupyter.core.budgets.RequestEstimate`
        and prices an estimated charge; never below :meth:`cost` of any usage within those counts.

        Raises:
            ValueError: a count is negative or not an int.
        """
        for n in (input_tokens, output_tokens):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError("token counts must be non-negative ints")
        p = self.price(model)
        return (input_tokens * max(p.input, p.cache_write, p.cache_read) + output_tokens * p.output) / _PER

    def table(self) -> dict[str, dict[str, float]]:
        """The merged table, for display (``jupyter relay budget``) and docs."""
        return {m: p.model_dump() for m, p in sorted(self._prices.items())}


def _num(value: Any) -> float:
    # Only used to derive default cache rates; Price validation reports bad values properly.
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
