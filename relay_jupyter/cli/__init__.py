"""``jupyter relay``: the terminal face of the broker.

Each command group lives in its own module that exposes ``register(subparsers)``;
this module only assembles them. A user mistake prints one line and exits 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..core.errors import RelayError

# Modules that contribute subcommands, in help order. Each has register(subparsers).
_GROUPS = ("serve", "daemon", "token", "grants", "tools", "kill", "teams", "hub")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter relay",
        description="relay-jupyter broker: serve it standalone, manage grants, tokens and tool pins.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _GROUPS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except RelayError as exc:
        print(f"jupyter relay: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
