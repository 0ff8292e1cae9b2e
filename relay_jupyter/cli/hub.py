"""``jupyter relay hub-service``: the broker as a JupyterHub-managed service (:mod:`relay_jupyter.server.hub_service`).

Run by the hub from a ``c.JupyterHub.services`` entry, as the service's own system user; never by hand
(it reads the service environment the hub sets: ``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_API_TOKEN``, ...).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``hub-service`` to ``jupyter relay``."""
    p = subparsers.add_parser(
        "hub-service", help="run the broker as a JupyterHub-managed service (from c.JupyterHub.services)",
        description="One broker for a JupyterHub: requests authenticate with the users' hub tokens "
                    "(scope access:services!service=<name>); origins are user:<name>/notebook:<path>. "
                    "See docs/multi-user.md.")
    p.add_argument("--config", metavar="FILE",
                   help="JSON object of broker settings (as for jupyter relay serve --config): keys, teams, store_url")
    p.add_argument("--data-dir", metavar="PATH", help="store, audit and logs (default: <jupyter data dir>/relay "
                                                      "of the service user)")
    p.add_argument("--secrets-file", metavar="PATH", help="a 0600 file of the service user holding API keys")
    p.add_argument("--mcp-config", metavar="PATH", help="mcp.json with the MCP servers to connect")
    p.add_argument("--auth-cache", metavar="SECONDS", type=int, default=None,
                   help="how long the hub's answer about a token is reused, 1-300 (default 10): a revoked hub "
                        "token keeps working this long at most")
    p.add_argument("--server-check", metavar="SECONDS", type=int, default=None,
                   help="how often the runs of kernels whose single-user server is gone (stopped or killed: its hub "
                        "token deleted) are ended, 1-300 (default 10)")
    p.set_defaults(func=_cmd_hub_service)


def _cmd_hub_service(args: argparse.Namespace) -> int:
    from ..server.hub_service import HubEnv, run_hub_service
    from .serve import broker_config

    from ..core.errors import Code, ConfigRefusal
    from ..server.hub_service import HUB_AUTH_CACHE_SECONDS, SERVER_CHECK_SECONDS

    cache = HUB_AUTH_CACHE_SECONDS if args.auth_cache is None else args.auth_cache
    if not 1 <= cache <= 300:  # 0 would be HubAuth's "cache forever"
        raise ConfigRefusal(Code.CONFIG_INVALID, "--auth-cache must be 1-300 seconds")
    check = SERVER_CHECK_SECONDS if args.server_check is None else args.server_check
    if not 1 <= check <= 300:
        raise ConfigRefusal(Code.CONFIG_INVALID, "--server-check must be 1-300 seconds")
    env = HubEnv.from_env()
    config = broker_config(argparse.Namespace(config=args.config, data_dir=args.data_dir,
                                              secrets_file=args.secrets_file, mcp_config=args.mcp_config,
                                              consent_timeout=None))
    return run_hub_service(config, env, auth_cache=cache, server_check=check)
