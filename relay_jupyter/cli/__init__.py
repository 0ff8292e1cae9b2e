"""``jupyter relay``: the terminal face of the broker.

Each command group lives in its own module that exposes ``register(subparsers)``;
this module only assembles them into one argparse parser, which the Jupyter application
of :mod:`relay_jupyter.cli.app` runs under (``--version``, ``--debug``, ``--RelayApp.x=y``,
``--generate-config``). A user mistake prints one line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .app import OneLineParser, run

# Modules that contribute subcommands, in help order. Each has register(subparsers).
_GROUPS = ("serve", "daemon", "token", "grants", "tools", "kill", "teams", "hub", "budget", "audit", "profiles",
           "pricing")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="jupyter relay",
        description="relay-jupyter broker: serve it standalone, manage grants, tokens and tool pins.",
    )
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
    """``jupyter relay`` (the console script ``jupyter-relay``); returns the exit status."""
    return run(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
