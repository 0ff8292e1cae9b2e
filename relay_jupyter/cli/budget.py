"""``jupyter relay budget set --team NAME``: change a team's day and month limits without editing the configuration
(docs/multi-user.md "Team budgets"). The limits go to the ``team_limits`` table of the store the settings name
(storage/team_limits.py): the SQLite file of the data dir, or the PostgreSQL database every user's broker shares, whose
brokers read it at each request; the team must be one of ``c.RelayApp.teams`` (its members stay the configured ones,
or the hub group's). On a hub, run it as the service's user with the service's ``--config``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ..core.errors import Code, ConfigRefusal
from ..core.teams import TeamBudget, Teams

__all__ = ["register"]

_AXES = (("tokens_per_day", "tokens-per-day", int), ("cost_per_day_usd", "cost-per-day", float),
         ("tokens_per_month", "tokens-per-month", int), ("cost_per_month_usd", "cost-per-month", float))


def register(subparsers: Any) -> None:
    """Add ``budget`` (``set``) to ``jupyter relay``."""
    p = subparsers.add_parser("budget", help="team budgets: change a team's limits (no config edit, no restart)")
    sub = p.add_subparsers(dest="budget_command", metavar="ACTION")
    st = sub.add_parser("set", help="set a team's day/month limits for tokens and cost ('none' = no limit)")
    st.add_argument("--team", required=True, metavar="NAME", help="a team of c.RelayApp.teams")
    for _field, flag, _kind in _AXES:
        st.add_argument(f"--{flag}", dest=_field, metavar="N|none", help=f"{flag.replace('-', ' ')} ('none': no limit)")
    st.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    st.add_argument("--data-dir", metavar="DIR", help="the broker's data dir (its relay.db holds the limits)")
    st.add_argument("--json", action="store_true", help="print the team's limits as JSON")
    st.set_defaults(func=_cmd_set)


def _value(flag: str, raw: str, kind: type) -> int | float | None:
    if raw.strip().lower() == "none":
        return None
    try:
        value = kind(raw) if kind is float else int(raw, 10)
    except ValueError:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--{flag}: {raw[:40]!r} is not a number (or 'none')") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--{flag}: must be a finite number >= 0")
    return value


def _cmd_set(args: argparse.Namespace) -> int:
    from ..storage.paths import ensure_private_dir
    from .serve import broker_config

    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir))
    teams = Teams.from_config(config.teams)
    team = teams.get(args.team)
    if team is None:
        known = ", ".join(t.name for t in teams) or "none"
        raise ConfigRefusal(Code.CONFIG_INVALID, f"no team {args.team[:64]!r} in c.RelayApp.teams (configured: {known}); "
                                                 "add it there first (its members, or a hub group of that name)")
    changes = {name: _value(flag, getattr(args, name), kind) for name, flag, kind in _AXES
               if getattr(args, name) is not None}
    if not changes:
        raise ConfigRefusal(Code.CONFIG_INVALID, "give at least one of --tokens-per-day, --cost-per-day, "
                                                 "--tokens-per-month, --cost-per-month")
    from .teams import _open_store, _teams_in_force

    if config.data_dir:
        ensure_private_dir(Path(config.data_dir))
    store = _open_store(config)
    try:
        current = _teams_in_force(config, store).get(args.team)
        assert current is not None
        budget = TeamBudget(**{**current.budget.model_dump(), **changes})
        store.put_team_limits(args.team, budget.model_dump())
        where = store.path
    finally:
        store.close()
    if args.json:
        print(json.dumps({"team": args.team, **budget.model_dump()}, indent=2))
    else:
        shown = ", ".join(f"{k} {'no limit' if v is None else v}" for k, v in budget.model_dump().items())
        print(f"team {args.team}: {shown} (in the store {where}; every broker on it applies it from its next request)")
    return 0
