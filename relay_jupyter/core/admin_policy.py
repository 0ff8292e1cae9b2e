"""The admin policy: what an administrator allows at most — models, tools, run modes and budget ceilings — which a
user's grant can only narrow (issue 15 item 3; docs/multi-user.md "Admin policy").

    c.RelayApp.admin_policy = {
        "models": ["claude-sonnet-4-5", "claude-haiku-4-5"],   # absent: any model
        "tools": ["list_variables", "scratch_read", "run_code"], # absent: any tool
        "modes": ["ask", "review"],                             # absent: every mode
        "max_budget": {"tokens_per_day": 500000, "cost_per_day_usd": 10},  # ceilings; absent axis: none
    }

A grant is whatever a person consented to (a connect card, the terminal); the policy is applied every time the
grant is read (:meth:`AdminPolicy.narrow`), so a grant made before the policy, or a policy made stricter later,
never lets more through than the policy: the effective grant is the intersection of both, axis by axis.
Pure logic: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .types import Budget, Grant

__all__ = ["MODES", "AdminPolicy", "BudgetCeiling"]

#: The run modes a policy may allow (protocol/models_runs.py: RunStartParams.mode).
MODES = frozenset({"ask", "review", "full"})


class BudgetCeiling(BaseModel):
    """The largest limit a grant may carry on each axis; None: no ceiling on that axis."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: float | None = Field(default=None, ge=0)
    tokens_per_day: int | None = Field(default=None, ge=0)
    cost_per_day_usd: float | None = Field(default=None, ge=0)
    max_steps_per_run: int | None = Field(default=None, ge=0)
    max_tokens_per_run: int | None = Field(default=None, ge=0)

    @field_validator("requests_per_minute", "cost_per_day_usd")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    def cap(self, budget: Budget) -> Budget:
        """``budget`` with every axis at most the ceiling (a grant's "no limit" becomes the ceiling)."""
        update: dict[str, Any] = {}
        for name in type(self).model_fields:
            ceiling = getattr(self, name)
            if ceiling is None:
                continue
            mine = getattr(budget, name)
            if mine is None or mine > ceiling:
                update[name] = ceiling
        return budget.model_copy(update=update) if update else budget


def _names(values: Iterable[str] | None, what: str) -> frozenset[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise ValueError(f"{what} must be a list of names, not one string")
    out = frozenset(values)
    for v in out:
        if not isinstance(v, str) or not v or len(v) > 200 or not v.isprintable():
            raise ValueError(f"{what}: not a name: {v!r}")
    return out


def _meet(grant: frozenset[str], policy: frozenset[str] | None) -> frozenset[str]:
    """The names both allow: ``"*"`` on either side means "whatever the other allows"."""
    if policy is None or "*" in policy:
        return grant
    if "*" in grant:
        return policy
    return grant & policy


class AdminPolicy(BaseModel):
    """What the administrator allows at most. None on an axis: that axis is not restricted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: frozenset[str] | None = None
    tools: frozenset[str] | None = None
    modes: frozenset[str] | None = None
    max_budget: BudgetCeiling = Field(default_factory=BudgetCeiling)

    @field_validator("models", "tools", mode="before")
    @classmethod
    def _name_list(cls, v: Any, info: Any) -> Any:
        return _names(v, info.field_name)

    @field_validator("modes", mode="before")
    @classmethod
    def _modes(cls, v: Any) -> Any:
        names = _names(v, "modes")
        if names is not None and not names <= MODES:
            raise ValueError(f"modes are {', '.join(sorted(MODES))} (got {', '.join(sorted(names - MODES))})")
        return names

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AdminPolicy | None:
        """The policy of ``c.RelayApp.admin_policy`` (None when empty: nothing restricted).

        Raises:
            ValueError: one line naming the bad field.
        """
        if not config:
            return None
        if not isinstance(config, Mapping):
            raise ValueError("admin_policy must be a dict of {models, tools, modes, max_budget}")
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "value"
            raise ValueError(f"admin_policy.{where}: {err.get('msg', 'invalid')}") from None

    @property
    def restricts(self) -> bool:
        """True when the policy narrows anything at all."""
        return (self.models is not None or self.tools is not None or self.modes is not None
                or self.max_budget != BudgetCeiling())

    def narrow(self, grant: Grant) -> Grant:
        """The effective grant: ``grant`` with its tools and models cut to the policy's and every budget
        limit at most the ceiling. Never wider than ``grant`` nor than the policy; idempotent."""
        tools = _meet(grant.tools, self.tools)
        models = _meet(grant.models, self.models)
        budget = self.max_budget.cap(grant.budget)
        if tools == grant.tools and models == grant.models and budget == grant.budget:
            return grant
        return grant.model_copy(update={"tools": tools, "models": models, "budget": budget})

    def allows_mode(self, mode: str) -> bool:
        """Whether a run may use ``mode`` (``ask``, ``review``, ``full``)."""
        return mode in MODES and (self.modes is None or mode in self.modes)

    def refusal(self, mode: str) -> str | None:
        """A one-line reason a run in ``mode`` is refused, or None when it is allowed."""
        if self.allows_mode(mode):
            return None
        allowed = ", ".join(sorted(self.modes or ())) or "none"
        return f"the administrator's policy does not allow {mode!r} mode (allowed: {allowed})"
