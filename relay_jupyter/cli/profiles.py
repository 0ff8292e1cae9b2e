"""``jupyter relay profiles list``: the named upstreams of the model endpoints (``c.RelayApp.profiles``,
broker/profiles.py): each profile's base URLs, the secrets-file entry of each key and whether it is there.
Never a key."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``profiles`` (``list``) to the ``jupyter relay`` parser."""
    p = subparsers.add_parser("profiles", help="named upstreams of the model endpoints (c.RelayApp.profiles)")
    sub = p.add_subparsers(dest="profiles_command", metavar="ACTION")
    ls = sub.add_parser("list", help="every configured profile: URLs and whether its keys are in the secrets file")
    ls.add_argument("--config", metavar="JSON", help="broker settings (as for jupyter relay serve --config)")
    ls.add_argument("--data-dir", metavar="DIR", help="the relay data dir")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=_cmd_list)


def _cmd_list(args: argparse.Namespace) -> int:
    from ..broker.profiles import profile_rows
    from .serve import broker_config

    rows = profile_rows(broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir)))
    if args.json:
        print(json.dumps({"profiles": rows}, indent=2))
        return 0
    if not rows:
        print("no profiles are configured (c.RelayApp.profiles; docs/proxy.md)")
    for row in rows:
        print(row["profile"] + (f"  ({row['description']})" if row["description"] else ""))
        for wire in ("anthropic", "openai"):
            if row[wire] is not None:
                r = row[wire]
                print(f"  {wire}: {r['base_url']}  key {r['key_entry']!r}: {r['key']}")
    return 0
