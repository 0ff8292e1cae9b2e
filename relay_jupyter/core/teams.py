"""Teams: budgets that several users' notebooks draw from together (issue 15, docs/multi-user.md).

A team has members (user names) and day and month limits for tokens and cost. Every model request
of a member's notebook is reserved against the notebook's own day limits (its grant) *and* against
each of its teams' day and month limits, together (core/budgets.py: ``BudgetLedger.reserve``): the
tightest wins, and a refusal holds nothing anywhere.

Outside a hub the list is configured (``c.RelayApp.teams``)::

    c.RelayApp.teams = {
        "ml": {"members": ["alice", "bob"], "tokens_per_day": 2_000_000, "cost_per_day_usd": 40,
               "tokens_per_month": 30_000_000, "cost_per_month_usd": 600},
    }

A team's usage lives in the same ledger as a notebook's, under the key ``team:<name>``: the day
row is keyed by the ISO date (``2026-12-01``), the month row by ``YYYY-MM`` (``2026-12``), so a
store shared by several brokers (PostgreSQL) shares the team's spend with no table of its own.

Who is the user of a notebook: an origin of the form ``user:<name>/…`` (a broker serving several
users) names it; any other origin belongs to the broker's own user (``BrokerConfig.user``, by
default ``$JUPYTERHUB_USER`` or the login name), which is how per-user brokers sharing one
database each charge their user's teams.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["TEAM_PREFIX", "Team", "TeamBudget", "Teams", "default_user", "month_of", "team_key", "teams_for_origin",
           "user_of_origin"]

TEAM_PREFIX = "team:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_USER_ORIGIN = re.compile(r"^user:([^/\x00]{1,256})/")


def team_key(name: str) -> str:
    """The ledger key of team ``name``."""
    return TEAM_PREFIX + name


def month_of(day: str) -> str:
    """``YYYY-MM`` of an ISO date ``YYYY-MM-DD``: the key of a month row."""
    return day[:7]


def user_of_origin(origin: str, default: str | None) -> str | None:
    """The user an origin belongs to: ``user:<name>/…`` names it, anything else is ``default``'s."""
    m = _USER_ORIGIN.match(origin)
    return m.group(1) if m else default


class TeamBudget(BaseModel):
    """A team's limits; None: no limit on that axis. ``not x <= limit`` checks refuse on NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens_per_day: int | None = Field(default=None, ge=0)
    cost_per_day_usd: float | None = Field(default=None, ge=0)
    tokens_per_month: int | None = Field(default=None, ge=0)
    cost_per_month_usd: float | None = Field(default=None, ge=0)

    @field_validator("cost_per_day_usd", "cost_per_month_usd")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    def limits(self, day: str) -> list[tuple[str, str, int | None, float | None]]:
        """``(period, ledger day key, token limit, cost limit)`` for the periods that have a limit."""
        out = []
        if self.tokens_per_day is not None or self.cost_per_day_usd is not None:
            out.append(("day", day, self.tokens_per_day, self.cost_per_day_usd))
        if self.tokens_per_month is not None or self.cost_per_month_usd is not None:
            out.append(("month", month_of(day), self.tokens_per_month, self.cost_per_month_usd))
        return out


class Team(BaseModel):
    """One team: a name, its members (user names) and its budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    members: frozenset[str] = frozenset()
    budget: TeamBudget = Field(default_factory=TeamBudget)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("a team name is 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit)")
        return v

    @field_validator("members")
    @classmethod
    def _members(cls, v: frozenset[str]) -> frozenset[str]:
        for m in v:
            if not m or "/" in m or "\x00" in m or len(m) > 256:
                raise ValueError(f"not a user name: {m!r}")
        return v

    @property
    def key(self) -> str:
        return team_key(self.name)


class Teams:
    """The configured teams; which teams a user belongs to."""

    def __init__(self, teams: Iterable[Team] = ()) -> None:
        self._teams: dict[str, Team] = {}
        for t in teams:
            if t.name in self._teams:
                raise ValueError(f"team {t.name!r} is defined twice")
            self._teams[t.name] = t

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Teams:
        """Teams from ``{name: {"members": [...], "tokens_per_day": …, …}}`` (``c.RelayApp.teams``).

        Raises:
            ValueError: one line naming the team and the bad field.
        """
        if not config:
            return cls()
        if not isinstance(config, Mapping):
            raise ValueError("teams must be a dict of {team name: {members, limits}}")
        teams = []
        for name, body in config.items():
            if not isinstance(body, Mapping):
                raise ValueError(f"team {name!r}: expected a dict with 'members' and limits")
            body = dict(body)
            members = body.pop("members", [])
            if isinstance(members, str) or not isinstance(members, Iterable):
                raise ValueError(f"team {name!r}: 'members' must be a list of user names")
            try:
                teams.append(Team(name=name, members=frozenset(members), budget=TeamBudget(**body)))
            except (ValidationError, TypeError) as exc:
                raise ValueError(f"team {name!r}: {_first_error(exc)}") from None
        return cls(teams)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self._teams.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._teams)

    def __bool__(self) -> bool:
        return bool(self._teams)

    def get(self, name: str) -> Team | None:
        return self._teams.get(name)

    def of_user(self, user: str | None, groups: Iterable[str] = ()) -> list[Team]:
        """The teams ``user`` is a member of, by name: listed in ``members``, or in a group of the same name
        as the team (``groups``: the user's JupyterHub groups, which the hub service learns with each token)."""
        if user is None:
            return []
        named = frozenset(groups)
        return [t for t in self if user in t.members or t.name in named]

    def with_limits(self, limits: Mapping[str, Mapping[str, Any]]) -> Teams:
        """A copy with each named team's budget replaced by ``limits[name]`` (``jupyter relay budget set
        --team``; a name that is not a configured team is ignored: members come from the configuration).

        Raises:
            ValueError: one line naming the team and the bad field.
        """
        out = self
        for name, body in limits.items():
            if self.get(name) is None:
                continue
            try:
                budget = TeamBudget(**dict(body))
            except (ValidationError, TypeError) as exc:
                raise ValueError(f"team {name!r}: {_first_error(exc)}") from None
            out = out.with_budget(name, budget)
        return out

    def with_budget(self, name: str, budget: TeamBudget) -> Teams:
        """A copy with team ``name``'s budget replaced (``jupyter relay budget set --team``)."""
        team = self._teams.get(name)
        if team is None:
            raise KeyError(name)
        return Teams([*(t for t in self if t.name != name), team.model_copy(update={"budget": budget})])


def default_user() -> str | None:
    """The user a single-user broker serves: ``$JUPYTERHUB_USER`` (a hub's single-user server), else
    the login name (None when there is none)."""
    import getpass
    import os

    try:
        return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
    except (KeyError, OSError):
        return None


def teams_for_origin(teams: Teams | Callable[[], Teams], user: str | None,
                     groups_of: Callable[[str], Iterable[str]] | None = None) -> Callable[[str], list[Team]]:
    """``origin -> teams`` for :class:`~relay_jupyter.core.budgets.BudgetLedger`: the teams of the
    origin's user (``user:<name>/…``), else of ``user`` (the broker's). ``teams``: the teams, or a function
    giving the ones now in force (limits set from the terminal). ``groups_of(user)``: the user's JupyterHub
    groups (a hub group is the team of the same name; the hub service passes it)."""
    current = teams if callable(teams) else (lambda: teams)

    def of(origin: str) -> list[Team]:
        who = user_of_origin(origin, user)
        groups = groups_of(who) if (groups_of is not None and who is not None) else ()
        return current().of_user(who, groups)

    return of


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        return f"{where}: {err.get('msg', 'invalid')}"
    return str(exc)


def current_month(ts: float) -> str:
    """``YYYY-MM`` (UTC) of epoch seconds ``ts``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m")
