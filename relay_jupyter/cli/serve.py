"""``jupyter relay serve``: run the broker as a standalone daemon (see :mod:`relay_jupyter.server.daemon`)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import Code, ConfigRefusal

if TYPE_CHECKING:
    from ..broker.config import BrokerConfig

# the daemon (server.daemon: tornado, the broker's assembly) and the broker's config are imported by `serve` itself,
# not when `jupyter relay`'s parser is built: every other command (status, stop, grants, ...) would pay for them

__all__ = ["broker_config", "register"]


def register(subparsers: Any) -> None:
    """Add ``serve`` to ``jupyter relay``."""
    p = subparsers.add_parser(
        "serve", help="run the broker as a standalone daemon (Unix socket or TCP with a bearer token)",
        description="Serve the relay endpoints (/relay/rpc, /relay/events, /relay/healthz, /relay/readyz, "
                    "/relay/metrics) outside Jupyter. Stop it with `jupyter relay stop` or Ctrl-C.")
    p.add_argument("--listen", metavar="ADDRESS",
                   help="unix:///absolute/path.sock (default: <jupyter runtime dir>/relay/relay.sock) or "
                        "tcp://127.0.0.1:PORT (port 0 picks a free one; see `jupyter relay status`)")
    p.add_argument("--unauthenticated-metrics", action="store_true",
                   help="TCP: let healthz, readyz and metrics answer without the token (for Prometheus)")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                   help="exit after this many seconds with no active runs and no requests")
    p.add_argument("--data-dir", metavar="PATH",
                   help="store, audit, token and logs (default: <jupyter data dir>/relay)")
    p.add_argument("--config", metavar="FILE",
                   help="JSON object of broker settings, over the c.RelayApp.* of the Jupyter config files (same names: consent_timeout, "
                        "anthropic_base_url, mcp_config_path, pricing, ...)")
    p.add_argument("--consent-timeout", type=float, metavar="SECONDS",
                   help="seconds a permission request waits before it is denied (default 300)")
    p.add_argument("--mcp-config", metavar="PATH", help="mcp.json with the MCP servers to connect")
    p.add_argument("--secrets-file", metavar="PATH", help="a 0600 file holding API keys")
    p.set_defaults(func=_cmd_serve)
    p.epilog = ("Any broker setting can also be given as --RelayApp.<name>=VALUE (over the config files and --config; "
                "the flags above win); --debug logs relay's debug lines to the daemon log and stderr.")


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    """The broker settings: ``c.RelayApp.*`` from the user's Jupyter config files
    (:mod:`relay_jupyter.server.jupyter_config`), overlaid with ``--config``, then the command line's
    ``--RelayApp.<name>=value``, then the individual flags.

    Raises:
        ConfigRefusal: CONFIG_INVALID naming the file or the first bad setting.
    """
    from pydantic import ValidationError

    from ..broker.config import BrokerConfig
    from ..server.jupyter_config import broker_settings_from_files, command_line_settings

    # the user's Jupyter config files first (c.RelayApp.*, as inside Jupyter), then --config, then flags
    values: dict[str, Any] = broker_settings_from_files(command_line=False)
    if args.config:
        try:
            loaded = json.loads(Path(args.config).read_text())
        except OSError as exc:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"cannot read {args.config}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{args.config} is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{args.config} must hold a JSON object of settings")
        values.update(loaded)
    values.update(command_line_settings())
    for flag, key in (("data_dir", "data_dir"), ("consent_timeout", "consent_timeout"),
                      ("mcp_config", "mcp_config_path"), ("secrets_file", "secrets_file")):
        value = getattr(args, flag, None)
        if value is not None:
            values[key] = value
    try:
        return BrokerConfig.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise ConfigRefusal(Code.CONFIG_INVALID, f"broker setting {where}: {first['msg']}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..server.daemon import DaemonOptions, parse_listen, run
    from ..server.jupyter_config import config_files

    if args.idle_timeout is not None and not args.idle_timeout > 0:
        raise ConfigRefusal(Code.CONFIG_INVALID, "--idle-timeout must be a positive number of seconds")
    listen = parse_listen(args.listen)
    if args.unauthenticated_metrics and listen.kind == "unix":
        raise ConfigRefusal(Code.CONFIG_INVALID, "--unauthenticated-metrics applies to tcp:// only "
                                                 "(the Unix socket needs no token)")
    config = broker_config(args)
    options = DaemonOptions(listen=listen, config=config,
                            unauthenticated_metrics=args.unauthenticated_metrics, idle_timeout=args.idle_timeout,
                            log_level=getattr(args, "log_level", logging.INFO),
                            config_files=tuple(str(f) for f in config_files()))
    return run(options)
