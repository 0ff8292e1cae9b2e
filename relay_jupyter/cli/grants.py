"""``jupyter relay grants add | list | revoke``: grants issued from the terminal.

A person typing ``grants add`` at the terminal is the consent (consent id ``terminal:<ms>-<hex>``,
fresh each time, so it may replace a narrower grant). The commands work on the store in the data
dir directly, whether or not a broker runs: a running broker sees the change within a second
(its grant cache lives that long). The action is written to the audit log when no broker holds it;
otherwise the grant's own ``consent_id`` is the record.

    jupyter relay grants add daemon:default --tools list_variables,read_file --models claude-sonnet-4-5 \\
        --budget tokens=100000,cost=2,rpm=20 --expires 7d
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..core.errors import Code, ConfigRefusal
from ..core.grants import GrantBook
from ..core.types import AuditRecord, Budget, Grant, ProfileBudget
from ..storage.audit_log import AuditLog
from ..storage.errors import StoreError
from ..storage.paths import data_dir, ensure_private_dir
from .teams import open_configured_store

__all__ = ["parse_budget", "parse_duration", "parse_list", "register"]

#: ``--budget`` keys and the Budget fields they set.
BUDGET_KEYS = {
    "tokens": "tokens_per_day",
    "cost": "cost_per_day_usd",
    "rpm": "requests_per_minute",
    "steps": "max_steps_per_run",
    "run_tokens": "max_tokens_per_run",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_ORIGIN = re.compile(r"^[a-z]+:[^\x00-\x1f\x7f]{1,1000}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:*/-]{1,200}$")


def register(subparsers: Any) -> None:
    """Add the ``grants`` command group to ``jupyter relay``."""
    p = subparsers.add_parser("grants", help="issue, list and revoke grants from the terminal",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="grants_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", metavar="PATH", help="default: <jupyter data dir>/relay")

    a = sub.add_parser("add", parents=[common], help="grant tools, models and a budget to an origin")
    a.add_argument("origin", help="notebook:<path>, daemon:<name>, ...")
    a.add_argument("--tools", required=True, help="comma-separated tool names ('*' = every tool, still gated)")
    a.add_argument("--models", default="", help="comma-separated model ids ('*' = any the broker allows)")
    a.add_argument("--proxy-tools", default=None, help="comma-separated tool names a model answer relayed "
                   "through relay/anthropic or relay/openai may carry (others are refused; docs/proxy.md); "
                   "omitted = not restricted")
    a.add_argument("--profiles", default="", help="comma-separated profile names (c.RelayApp.profiles) the model "
                   "endpoints may use for this origin ('*' = every profile)")
    a.add_argument("--profile-budget", action="append", default=[], metavar="PROFILE:KEY=VALUE[,KEY=VALUE]",
                   help="day limits of the requests to one profile, besides --budget: tokens, cost (USD); e.g. "
                        "team:tokens=50000,cost=2 (repeat for another profile)")
    a.add_argument("--budget", default="",
                   help="comma-separated key=value: tokens (per day), cost (USD per day), rpm, steps (per run), "
                        "run_tokens (per run); 'none' = no limit; unset keys keep their defaults")
    a.add_argument("--expires", metavar="DURATION", help="e.g. 90m, 12h, 7d, 2w (default: never)")
    a.set_defaults(func=_cmd_add)

    ls = sub.add_parser("list", parents=[common], help="live grants")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=_cmd_list)

    r = sub.add_parser("revoke", parents=[common], help="revoke the grant of an origin")
    r.add_argument("origin")
    r.set_defaults(func=_cmd_revoke)


def parse_list(text: str, what: str) -> frozenset[str]:
    """``a,b`` -> {a, b}; each name checked.

    Raises:
        ConfigRefusal: CONFIG_INVALID naming the bad entry.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not _NAME.match(name):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"--{what}: {name[:60]!r} is not a valid name")
    return frozenset(names)


def parse_budget(text: str) -> Budget:
    """``tokens=100000,cost=2.5,rpm=20`` -> a Budget (unset keys keep the defaults, ``none`` = no limit).

    Raises:
        ConfigRefusal: CONFIG_INVALID for an unknown key, a bad or negative number.
    """
    values: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in BUDGET_KEYS:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"--budget: {item[:60]!r} is not key=value with key in {', '.join(BUDGET_KEYS)}")
        field = BUDGET_KEYS[key]
        if raw.lower() == "none":
            values[field] = None
            continue
        try:
            number = float(raw)
        except ValueError:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"--budget: {key}={raw[:30]!r} is not a number") from None
        if not number >= 0 or number == float("inf"):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"--budget: {key} must be a finite number >= 0")
        if field in ("tokens_per_day", "max_steps_per_run", "max_tokens_per_run"):
            if number != int(number):
                raise ConfigRefusal(Code.CONFIG_INVALID, f"--budget: {key} must be a whole number")
            number = int(number)
        values[field] = number
    try:
        return Budget(**values)
    except ValidationError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--budget: {exc.errors()[0]['msg']}") from None


def parse_profile_budget(text: str) -> ProfileBudget:
    """``team:tokens=50000,cost=2`` -> a ProfileBudget (day limits of one profile; ``none`` = no limit).

    Raises:
        ConfigRefusal: CONFIG_INVALID for a missing profile name, an unknown key, a bad or negative number.
    """
    name, sep, limits = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--profile-budget: {text[:60]!r} is not PROFILE:KEY=VALUE,...")
    values: dict[str, Any] = {}
    for item in (i.strip() for i in limits.split(",") if i.strip()):
        key, eq, raw = item.partition("=")
        field = {"tokens": "tokens_per_day", "cost": "cost_per_day_usd"}.get(key.strip())
        if not eq or field is None:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"--profile-budget: {item[:60]!r} is not key=value with key in tokens, cost")
        raw = raw.strip()
        if raw.lower() == "none":
            values[field] = None
            continue
        try:
            number = float(raw)
        except ValueError:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"--profile-budget: {key.strip()}={raw[:30]!r} is not a number") from None
        if not number >= 0 or number == float("inf") or (field == "tokens_per_day" and number != int(number)):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"--profile-budget: {key.strip()} must be a finite number >= 0"
                                + (", whole" if field == "tokens_per_day" else ""))
        values[field] = int(number) if field == "tokens_per_day" else number
    if not values:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--profile-budget: name a limit for {name[:60]!r} (tokens, cost)")
    try:
        return ProfileBudget(profile=name, **values)
    except ValidationError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--profile-budget: {exc.errors()[0]['msg']}") from None


def parse_duration(text: str) -> float:
    """``90m``, ``12h``, ``7d``, ``2w`` or plain seconds -> seconds.

    Raises:
        ConfigRefusal: CONFIG_INVALID.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"--expires: {text[:30]!r} is not a duration like 90m, 12h, 7d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _running_roots() -> dict[Path, list[str]]:
    """The data dirs of this user's running brokers -> which brokers use each: daemons (their state files) and
    the brokers inside Jupyter servers (``server/server_state.py``)."""
    from ..server.daemon import read_states
    from ..server.server_state import server_states

    roots: dict[Path, list[str]] = {}
    for state in read_states():
        roots.setdefault(Path(state["data_dir"]), []).append(f"daemon {state['listen']}")
    for state in server_states():
        if state.get("data_dir"):
            roots.setdefault(Path(state["data_dir"]), []).append(f"jupyter server {state.get('url')}")
    return roots


def _root(args: argparse.Namespace, origin: str | None = None) -> Path:
    """``--data-dir``; else the data dir of the running broker(s) that serve ``origin`` (``daemon:...``: daemons,
    any other: Jupyter servers) when they share one; else ``<jupyter data dir>/relay``."""
    if args.data_dir:
        return ensure_private_dir(Path(args.data_dir))
    if origin is not None:
        daemon = origin.startswith("daemon:")
        serving = {root for root, brokers in _running_roots().items()
                   if any(b.startswith("daemon ") == daemon for b in brokers)}
        if len(serving) == 1:
            return ensure_private_dir(serving.pop())
    return data_dir()


def _check_origin(origin: str) -> str:
    if not _ORIGIN.match(origin):
        raise ConfigRefusal(Code.CONFIG_INVALID,
                            f"{origin[:80]!r} is not an origin (kind:name, e.g. notebook:analysis.ipynb or "
                            "daemon:default)")
    return origin


def _audit(root: Path, origin: str, action: str, arguments: dict[str, Any]) -> bool:
    """Append one audit record; False when a running broker holds the audit log."""
    try:
        log = AuditLog(root / "audit.jsonl")
    except StoreError:
        return False
    try:
        log.append(AuditRecord(ts=time.time(), origin=origin, tool=action, decision="ok", answered_by="terminal",
                               arguments=arguments))
    finally:
        log.close()
    return True


def _describe(g: Grant) -> str:
    b = g.budget
    limits = ", ".join(f"{k}={getattr(b, f)}" for k, f in BUDGET_KEYS.items())
    expires = "never" if g.expires_at is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(g.expires_at))
    proxy = "" if g.proxy_tools is None else f"\n  answers may call: {', '.join(sorted(g.proxy_tools)) or '-'}"
    proxy += f"\n  profiles: {', '.join(sorted(g.profiles))}" if g.profiles else ""
    proxy += "".join(f"\n  profile {p.profile}: tokens={p.tokens_per_day}, cost={p.cost_per_day_usd} per day"
                     for p in g.profile_budgets)
    return (f"{g.origin}\n  tools:   {', '.join(sorted(g.tools)) or '-'}\n  models:  {', '.join(sorted(g.models)) or '-'}"
            f"{proxy}\n  budget:  {limits}\n  expires: {expires}\n  consent: {g.consent_id}")


def _cmd_add(args: argparse.Namespace) -> int:
    origin = _check_origin(args.origin)
    tools = parse_list(args.tools, "tools")
    if not tools:
        raise ConfigRefusal(Code.CONFIG_INVALID, "--tools: name at least one tool")
    models = parse_list(args.models, "models")
    budget = parse_budget(args.budget)
    now = time.time()
    expires = None if args.expires is None else now + parse_duration(args.expires)
    proxy_tools = None if args.proxy_tools is None else parse_list(args.proxy_tools, "proxy-tools")
    grant = Grant(origin=origin, tools=tools, models=models, budget=budget, expires_at=expires, created_at=now,
                  consent_id=f"terminal:{int(now * 1000)}-{secrets.token_hex(4)}", proxy_tools=proxy_tools,
                  profiles=parse_list(args.profiles, "profiles"),
                  profile_budgets=_profile_budgets(args.profile_budget))
    root = _root(args, origin)
    store = open_configured_store(root)  # c.RelayApp.store_url: the PostgreSQL store the broker reads
    try:
        stored = GrantBook(store, cache_ttl=0).issue(grant)
    finally:
        store.close()
    audited = _audit(root, origin, "grant.create", {"tools": sorted(tools), "models": sorted(models),
                                                     "consent_id": grant.consent_id, "via": "terminal"})
    print("granted " + _describe(stored))
    if not audited:
        print("note: a running broker holds the audit log; the grant's consent id is the record", file=sys.stderr)
    return 0


def _profile_budgets(items: list[str]) -> tuple[ProfileBudget, ...]:
    budgets = [parse_profile_budget(i) for i in items]
    if len({b.profile for b in budgets}) != len(budgets):
        raise ConfigRefusal(Code.CONFIG_INVALID, "--profile-budget: one per profile")
    return tuple(budgets)


def _list_root(root: Path) -> list[Grant]:
    store = open_configured_store(root)
    try:
        return GrantBook(store, cache_ttl=0).list()
    finally:
        store.close()


def _cmd_list(args: argparse.Namespace) -> int:
    # every store a running broker reads (a daemon or a Jupyter server with its own data dir), and the default one
    roots = [_root(args)]
    running = {} if args.data_dir else _running_roots()
    roots += [r for r in running if r.resolve() != roots[0].resolve() and (r / "relay.db").exists()]
    per_root = [(root, _list_root(root)) for root in roots]
    grants = [g for _, found in per_root for g in found]
    if args.json:
        out: dict[str, Any] = {"grants": [g.model_dump(mode="json") for g in grants]}
        if len(per_root) > 1:
            out["stores"] = [{"data_dir": str(root), "brokers": running.get(root, []),
                              "origins": sorted(g.origin for g in found)} for root, found in per_root]
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if not grants:
        print("no live grants")
    for root, found in per_root:
        if len(per_root) > 1 and found:
            print(f"==> {root} ({', '.join(running.get(root, [])) or 'no broker running'}) <==")
        for g in sorted(found, key=lambda g: g.origin):
            print(_describe(g))
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    origin = _check_origin(args.origin)
    root = _root(args, origin)
    store = open_configured_store(root)
    try:
        revoked = GrantBook(store, cache_ttl=0).revoke(origin)
    finally:
        store.close()
    if revoked:
        _audit(root, origin, "grant.revoke", {"revoked": True, "via": "terminal"})
    print(f"revoked the grant of {origin}" if revoked else f"{origin} had no grant")
    return 0
