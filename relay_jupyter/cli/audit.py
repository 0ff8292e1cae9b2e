"""``jupyter relay audit [--team T | --user U] [--since WHEN]``: the audit trail of a team's (or a user's)
notebooks, from the store the settings name: the database copy on PostgreSQL (``store_url``), else the JSON-lines
audit files of the data dir (docs/multi-user.md). A record belongs to the user its origin names
(``user:<name>/…``, the hub service's origins), else to the broker's user (``c.RelayApp.user``).

Team membership is the configured ``members`` of ``c.RelayApp.teams``, the hub group of the same name (live with
``JUPYTERHUB_API_URL`` + ``JUPYTERHUB_API_TOKEN``, else the hub service's copy in its data dir) and ``--members``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.errors import Code, ConfigRefusal
from ..core.teams import Teams, default_user, user_of_origin

__all__ = ["audit_rows", "hub_group_members_of", "parse_since", "register"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_FIELDS = ("seq", "ts", "origin", "tool", "tool_class", "decision", "code", "run_id", "call_id", "answered_by")


def register(subparsers: Any) -> None:
    """Add ``audit`` to ``jupyter relay``."""
    p = subparsers.add_parser("audit", help="the audit trail of a team's or a user's notebooks")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--team", metavar="NAME", help="the members of this team (c.RelayApp.teams)")
    who.add_argument("--user", metavar="NAME", help="one user's notebooks")
    p.add_argument("--members", metavar="A,B", help="more members of --team (e.g. its hub group's)")
    p.add_argument("--since", metavar="WHEN", help="YYYY-MM-DD (UTC) or a duration back from now: 90m, 12h, 7d, 2w")
    p.add_argument("-n", type=int, default=1000, metavar="N", help="at most the newest N records (default 1000)")
    p.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    p.add_argument("--data-dir", metavar="DIR", help="the relay data dir (its audit*.jsonl files)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_audit)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """Epoch seconds of ``YYYY-MM-DD`` (00:00 UTC) or of ``now`` minus a duration (``7d``); None for None.

    Raises:
        ConfigRefusal: CONFIG_INVALID in one line.
    """
    if text is None:
        return None
    m = _DURATION.match(text.strip())
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ConfigRefusal(Code.CONFIG_INVALID,
                            f"--since: {text[:40]!r} is neither YYYY-MM-DD nor a duration like 12h or 7d") from None


def _file_records(root: Path) -> list[dict[str, Any]]:
    from ..storage.audit_log import read_audit_file

    out: list[dict[str, Any]] = []
    for path in sorted(root.glob("audit*.jsonl*")):
        try:
            out += read_audit_file(path)
        except OSError:
            continue
    return out


def audit_rows(config: Any, *, members: set[str] | None, since: float | None = None,
               limit: int = 1000) -> list[dict[str, Any]]:
    """Audit records (dicts, oldest first) of notebooks whose user is in ``members`` (None: everyone), at or
    after ``since``; the newest ``limit``. For notebooks: ``pandas.DataFrame(audit_rows(...))``."""
    default = config.user or default_user()
    if config.store_url:
        from ..storage.postgres import PostgresStore

        store = PostgresStore.open(config.store_url, password_file=config.store_password_file,
                                   secrets_file=config.secrets_file, namespace=default, max_size=1)
        try:
            records = [r.model_dump(mode="json") for r in store.audit_records(since=since, limit=100_000)]
        finally:
            store.close()
    else:
        from ..storage.paths import data_dir

        root = Path(config.data_dir) if config.data_dir else data_dir()
        records = _file_records(root)
    rows = []
    for r in records:
        if since is not None and float(r.get("ts", 0)) < since:
            continue
        if members is not None and user_of_origin(str(r.get("origin", "")), default) not in members:
            continue
        rows.append({k: r.get(k) for k in _FIELDS})
    rows.sort(key=lambda r: (float(r["ts"] or 0), int(r["seq"] or 0)))
    return rows[-limit:] if limit > 0 else []


def hub_group_members_of(team: str, config: Any) -> set[str]:
    """The hub group's members: live with a hub token in the environment, else the hub service's copy."""
    from ..server.hub_service import HubGroupsUnavailable, hub_group_members
    from ..storage.paths import data_dir as default_data_dir

    root = Path(config.data_dir) if config.data_dir else default_data_dir()
    try:
        return set(hub_group_members(team, root))
    except HubGroupsUnavailable as exc:
        # e.g. a user's server token in her terminal (deployment 2 on a hub) may not read groups: say so in one
        # line and use what the hub service copied, if anything (never the token)
        print(f"jupyter relay: cannot read hub group {team[:64]!r} ({exc.reason}); using the hub service's copy, "
              "if any, and the configured members", file=sys.stderr)
        return set(hub_group_members(team, root, environ={}))


def _cmd_audit(args: argparse.Namespace) -> int:
    from .serve import broker_config

    if args.n < 1:
        raise ConfigRefusal(Code.CONFIG_INVALID, "-n must be at least 1")
    since = parse_since(args.since)
    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir))
    members: set[str] | None = None
    if args.team:
        team = Teams.from_config(config.teams).get(args.team)
        extra = {m.strip() for m in (args.members or "").split(",") if m.strip()}
        if team is None and not extra:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"no team {args.team[:64]!r} in c.RelayApp.teams "
                                                     "(or give its --members)")
        members = set(team.members if team is not None else ()) | extra
        if team is not None:  # on a hub the team is also the hub group of its name (docs/multi-user.md)
            members |= hub_group_members_of(args.team, config)
    elif args.user:
        members = {args.user}
    rows = audit_rows(config, members=members, since=since, limit=args.n)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no audit records" + (f" since {args.since}" if args.since else ""))
    for r in rows:
        when = datetime.fromtimestamp(float(r["ts"]), UTC).strftime("%Y-%m-%d %H:%M:%S")
        code = f" {r['code']}" if r.get("code") else ""
        print(f"{when}  {r['origin']}  {r['tool']}  {r['decision']}{code}")
    return 0
