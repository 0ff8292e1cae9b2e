"""``jupyter relay teams list``: the configured teams, their members and what they have spent today and
this month against their limits (docs/multi-user.md). Reads the same settings as ``jupyter relay serve``
(``c.RelayApp.*`` from the Jupyter config files, then ``--config``), and the store they name: the
PostgreSQL ``store_url`` (team rows are shared by every user's broker) or the SQLite file of the data dir.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..core.budgets import utc_day
from ..core.errors import Code, ConfigRefusal
from ..core.teams import Teams, default_user

__all__ = ["open_configured_store", "register", "spend_frame", "team_rows"]


def register(subparsers: Any) -> None:
    """Add ``teams`` (``list``) to the ``jupyter relay`` parser."""
    p = subparsers.add_parser("teams", help="team budgets: members, spend today and this month, limits")
    sub = p.add_subparsers(dest="teams_command", metavar="ACTION")
    ls = sub.add_parser("list", help="every configured team with its spend and limits")
    ls.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    ls.add_argument("--data-dir", metavar="DIR", help="the relay data dir (SQLite store)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=_cmd_list)
    sp = sub.add_parser("spend", help="spend per user and per team, per day (the PostgreSQL store)")
    sp.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    sp.add_argument("--since", metavar="YYYY-MM-DD", help="from this UTC day on (default: every day kept)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=_cmd_spend)


def spend_frame(rows: list[dict[str, Any]]) -> Any:
    """The rows of ``PostgresStore.spend_rows`` as a pandas DataFrame (columns ``day, user, team, tokens,
    cost_usd``): the admin view of spend per user and team, for a notebook
    (``spend_frame(store.spend_rows()).pivot_table(index="day", columns="user", values="tokens")``)."""
    import pandas as pd

    return pd.DataFrame(rows, columns=["day", "user", "team", "tokens", "cost_usd"])


def team_rows(store: Any, teams: Teams, now: float | None = None) -> list[dict[str, Any]]:
    """One dict per team: ``{team, members, day: {key, tokens, cost_usd, reserved_tokens, reserved_cost_usd,
    tokens_limit, cost_limit}, month: {...}}``."""
    day = utc_day(time.time() if now is None else now)
    rows = []
    for team in teams:
        row: dict[str, Any] = {"team": team.name, "members": sorted(team.members)}
        b = team.budget
        for period, key, t_limit, c_limit in (("day", day, b.tokens_per_day, b.cost_per_day_usd),
                                              ("month", day[:7], b.tokens_per_month, b.cost_per_month_usd)):
            used_t, used_c = store.usage(team.key, key)
            held_t, held_c = store.held(team.key, key)
            row[period] = {"key": key, "tokens": int(used_t), "cost_usd": float(used_c), "reserved_tokens": int(held_t),
                           "reserved_cost_usd": float(held_c), "tokens_limit": t_limit, "cost_limit": c_limit}
        rows.append(row)
    return rows


def _open_store(config: Any) -> Any:
    if config.store_url:
        from ..storage.postgres import PostgresStore

        return PostgresStore.open(config.store_url, password_file=config.store_password_file,
                                  secrets_file=config.secrets_file, namespace=config.user or default_user(),
                                  max_size=1)
    from ..storage.paths import data_dir
    from ..storage.sqlite import Store

    root = Path(config.data_dir) if config.data_dir else data_dir()
    return Store.open(root / "relay.db")


def open_configured_store(root: Path) -> Any:
    """The store the user's broker uses: the PostgreSQL ``store_url`` of ``c.RelayApp`` in the Jupyter
    config files (this user's namespace), else the SQLite file in ``root`` (the data dir). Terminal
    commands that edit what a broker reads (``jupyter relay grants``) open it here, so a grant issued
    from the terminal reaches a broker on PostgreSQL."""
    from ..broker.config import BrokerConfig
    from ..server.jupyter_config import broker_settings_from_files

    settings = broker_settings_from_files()
    if settings.get("store_url"):
        return _open_store(BrokerConfig.model_validate(settings))
    from ..storage.sqlite import DB_NAME, Store

    return Store.open(Path(root) / DB_NAME)


def _cmd_spend(args: argparse.Namespace) -> int:
    from datetime import date

    from .serve import broker_config

    if args.since is not None:
        try:
            date.fromisoformat(args.since)
        except ValueError:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"--since: {args.since[:40]!r} is not a YYYY-MM-DD day") from None
    config = broker_config(argparse.Namespace(config=args.config))
    if not config.store_url:
        raise ConfigRefusal(Code.CONFIG_INVALID, "spend per user needs the shared PostgreSQL store (c.RelayApp.store_url); "
                                                 "on SQLite, jupyter relay teams list shows the teams' spend")
    store = _open_store(config)
    try:
        rows = store.spend_rows(args.since)
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no spend recorded" + (f" since {args.since}" if args.since else ""))
    for r in rows:
        who = f"team {r['team']}" if r["team"] else f"user {r['user']}"
        print(f"{r['day']}  {who}: {r['tokens']} tokens, ${r['cost_usd']:.4f}")
    return 0


def _limit(used: float, held: float, limit: float | None, unit: str) -> str:
    shown = f"{used:g}" + (f" (+{held:g} in flight)" if held else "")
    return f"{shown} / {'no limit' if limit is None else f'{limit:g}'} {unit}"


def _cmd_list(args: argparse.Namespace) -> int:
    from .serve import broker_config

    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir))
    teams = Teams.from_config(config.teams)
    if not teams:
        raise ConfigRefusal(Code.CONFIG_INVALID, "no teams are configured (c.RelayApp.teams); see docs/multi-user.md")
    store = _open_store(config)
    try:
        rows = team_rows(store, teams)
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['team']}: {', '.join(row['members']) or '(no members)'}")
        for period, label in (("day", "today"), ("month", "this month")):
            p = row[period]
            print(f"  {label} ({p['key']}): {_limit(p['tokens'], p['reserved_tokens'], p['tokens_limit'], 'tokens')}; "
                  f"{_limit(round(p['cost_usd'], 4), round(p['reserved_cost_usd'], 4), p['cost_limit'], 'USD')}")
    return 0
