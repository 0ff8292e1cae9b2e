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

__all__ = ["open_configured_store", "register", "spend_frame", "spend_plot", "spend_rows", "sqlite_spend_rows", "team_rows"]


def register(subparsers: Any) -> None:
    """Add ``teams`` (``list``) to the ``jupyter relay`` parser."""
    p = subparsers.add_parser("teams", help="team budgets: members, spend today and this month, limits")
    sub = p.add_subparsers(dest="teams_command", metavar="ACTION")
    ls = sub.add_parser("list", help="every configured team with its spend and limits")
    ls.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    ls.add_argument("--data-dir", metavar="DIR", help="the relay data dir (SQLite store)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=_cmd_list)
    sp = sub.add_parser("spend", help="spend per user and per team, per day (PostgreSQL or the SQLite store)")
    sp.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    sp.add_argument("--since", metavar="YYYY-MM-DD", help="from this UTC day on (default: every day kept)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--data-dir", metavar="DIR", help="the relay data dir (SQLite store)")
    sp.add_argument("--plot", metavar="FILE.png", help="also save a stacked bar chart of the spend (matplotlib)")
    sp.add_argument("--by", choices=("user", "team"), default="user", help="what the plot's colours are (default user)")
    sp.set_defaults(func=_cmd_spend)


def spend_rows(config: Any, since: str | None = None) -> list[dict[str, Any]]:
    """The admin view of spend, per UTC day from ``since`` (``YYYY-MM-DD``) on: one row per user
    (``{"day", "user", "team": None, "tokens", "cost_usd"}``, the sum of their notebooks' ledger rows) and one
    per team (``"user": None``), from the store ``config`` names: PostgreSQL (``PostgresStore.spend_rows``, every
    user's broker) or the SQLite file of the data dir (one broker: the hub service's, or a single user's, whose
    origins without ``user:<name>/`` are the broker's user's)."""
    if config.store_url:
        store = _open_store(config)
        try:
            rows = list(store.spend_rows(since))
            own = config.user or default_user()
            # this broker's own namespace per user its origins name (the hub service keeps every user's
            # notebooks, user:<name>/..., in its one namespace): its per-namespace row is split by user
            ledger = store.query("SELECT origin, day, tokens, cost_usd FROM ledger WHERE length(day) = 10 AND day >= %s",
                                 (since or "0000-00-00",))
        finally:
            store.close()
        if any(str(origin).startswith("user:") for origin, *_ in ledger):
            rows = [r for r in rows if not (r["team"] is None and r["user"] == own)]
            rows += _by_user(ledger, own)
        return sorted(rows, key=lambda r: (r["day"], r["team"] or "", r["user"] or ""))
    from ..storage.paths import data_dir
    from ..storage.sqlite import DB_NAME

    root = Path(config.data_dir) if config.data_dir else data_dir()
    return sqlite_spend_rows(root / DB_NAME, since, config.user or default_user())


def sqlite_spend_rows(path: Path, since: str | None, default: str | None) -> list[dict[str, Any]]:
    """:func:`spend_rows` of one SQLite store (read-only; an absent file has no spend)."""
    import sqlite3

    if not Path(path).exists():
        return []
    # read-only: an admin view must never take the broker's write lock
    conn = sqlite3.connect(f"file:{Path(path).as_posix()}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT origin, day, tokens, cost_usd FROM ledger WHERE length(day) = 10 AND day >= ? "
                            "ORDER BY day, origin", (since or "0000-00-00",)).fetchall()
    finally:
        conn.close()
    out = _by_user(rows, default, teams=True)
    return sorted(out, key=lambda r: (r["day"], r["team"] or "", r["user"] or ""))


def _by_user(rows: Any, default: str | None, *, teams: bool = False) -> list[dict[str, Any]]:
    """Ledger rows ``(origin, day, tokens, cost)`` summed per day and user (``user_of_origin``), and per team
    when ``teams`` (else team rows are left out)."""
    from ..core.teams import TEAM_PREFIX, user_of_origin

    totals: dict[tuple[str, str | None, str | None], list[float]] = {}
    for origin, day, tokens, cost in rows:
        if origin.startswith(TEAM_PREFIX):
            if not teams:
                continue
            key = (day, None, origin[len(TEAM_PREFIX):])
        else:
            key = (day, user_of_origin(origin, default) or "?", None)
        acc = totals.setdefault(key, [0, 0.0])
        acc[0] += int(tokens)
        acc[1] += float(cost)
    return [{"day": d, "user": u, "team": t, "tokens": int(v[0]), "cost_usd": float(v[1])} for (d, u, t), v in totals.items()]


def spend_plot(frame: Any, *, by: str = "user", value: str = "tokens", ax: Any = None) -> Any:
    """A stacked bar chart of ``frame`` (:func:`spend_frame`): ``value`` (``tokens`` or ``cost_usd``) per day,
    one colour per ``by`` (``user`` or ``team``). Returns the matplotlib Axes (``pip install
    'relay-jupyter[plots]'``); in a notebook it shows inline, in a script ``ax.figure.savefig("spend.png")``."""
    if by not in ("user", "team") or value not in ("tokens", "cost_usd"):
        raise ValueError("by is 'user' or 'team'; value is 'tokens' or 'cost_usd'")
    if ax is None:
        if _interactive():  # in a notebook: pyplot's figure, shown inline
            import matplotlib.pyplot as plt

            _, ax = plt.subplots(figsize=(8, 4))
        else:  # a script or the CLI: a figure of its own, no GUI backend, nothing global
            from matplotlib.figure import Figure

            ax = Figure(figsize=(8, 4)).subplots()
    rows = frame[frame[by].notna()]
    if rows.empty:
        ax.set_title(f"no spend per {by}")
        return ax
    table = rows.pivot_table(index="day", columns=by, values=value, aggfunc="sum", fill_value=0)
    table.plot(kind="bar", stacked=True, ax=ax)
    ax.set_xlabel("day (UTC)")
    ax.set_ylabel("USD" if value == "cost_usd" else "tokens")
    ax.set_title(f"spend per {by}")
    return ax


def _interactive() -> bool:
    import sys

    return "ipykernel" in sys.modules


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
    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir))
    rows = spend_rows(config, args.since)
    if args.plot:
        try:
            ax = spend_plot(spend_frame(rows), by=args.by)
        except ImportError:
            raise ConfigRefusal(Code.CONFIG_INVALID, "--plot needs matplotlib: pip install 'relay-jupyter[plots]'") from None
        ax.figure.savefig(args.plot, bbox_inches="tight")
        print(f"plot of spend per {args.by} written to {args.plot}")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no spend recorded" + (f" since {args.since}" if args.since else ""))
    for r in rows:
        who = f"team {r['team']}" if r["team"] else f"user {r['user']}"
        print(f"{r['day']}  {who}: {r['tokens']} tokens, ${r['cost_usd']:.4f}")
    return 0


def _teams_in_force(config: Any, store: Any) -> Teams:
    """The configured teams with the limits ``jupyter relay budget set --team`` stored over them (as the
    broker on ``store`` reads them: storage/team_limits.py)."""
    from ..storage.team_limits import team_limits_source

    return team_limits_source(Teams.from_config(config.teams), store, config)()


def _limit(used: float, held: float, limit: float | None, unit: str) -> str:
    shown = f"{used:g}" + (f" (+{held:g} in flight)" if held else "")
    return f"{shown} / {'no limit' if limit is None else f'{limit:g}'} {unit}"


def _cmd_list(args: argparse.Namespace) -> int:
    from .serve import broker_config

    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir))
    if not Teams.from_config(config.teams):
        raise ConfigRefusal(Code.CONFIG_INVALID, "no teams are configured (c.RelayApp.teams); see docs/multi-user.md")
    store = _open_store(config)
    try:
        rows = team_rows(store, _teams_in_force(config, store))
    finally:
        store.close()
    from .audit import hub_group_members_of

    for row in rows:  # on a hub a team is also the hub group of its name (docs/multi-user.md)
        row["members"] = sorted(set(row["members"]) | hub_group_members_of(row["team"], config))
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
