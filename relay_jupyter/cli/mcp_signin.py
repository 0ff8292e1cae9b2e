"""``jupyter relay mcp-signin SERVER``: OAuth sign-in to an HTTP MCP server from a terminal (for the daemon).

The standalone daemon has no route a browser could be sent back to, so the sign-in happens here, as a native
app does it (RFC 8252, loopback redirect): this command listens on ``http://127.0.0.1:<random port>/callback``
for the one redirect, prints the authorization link (and opens it with ``--open``), and the MCP SDK's client
auth does the protocol — metadata discovery, dynamic client registration, authorization code with PKCE, the
token exchange — through relay's own connection code (``mcp/signin.py``'s :class:`BrokerSignIn`, the endpoint
policy on every request). Tokens go to the same 0600 files in ``<data dir>/mcp-oauth/`` the Jupyter server and
the daemon use (a running daemon connects the server on its next tools listing or run). Nothing secret is
printed: the link carries the PKCE challenge and a one-time state, never the verifier or a token.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import Code, ConfigRefusal

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``mcp-signin`` to ``jupyter relay``."""
    p = subparsers.add_parser(
        "mcp-signin", help="sign in to an HTTP MCP server with OAuth (for the standalone daemon)",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("server", help="the server's name in mcp.json (an entry with a url and no Authorization header)")
    p.add_argument("--config", metavar="PATH", help="mcp.json to use (default: <jupyter config dir>/mcp.json)")
    p.add_argument("--data-dir", metavar="PATH", help="relay data dir (default: <jupyter data dir>/relay)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for you to sign in (default 600)")
    p.add_argument("--open", action="store_true", help="open the link in the default browser")
    p.set_defaults(func=_cmd_signin)


class _Callback:
    """The loopback redirect listener: ``GET /callback?code&state`` hands the code to the waiting flow, once."""

    def __init__(self, server: str) -> None:
        from tornado.httpserver import HTTPServer
        from tornado.netutil import bind_sockets
        from tornado.web import Application, RequestHandler

        outer = self

        class Handler(RequestHandler):
            def set_default_headers(self) -> None:
                self.clear_header("Server")
                self.set_header("Referrer-Policy", "no-referrer")
                self.set_header("Cache-Control", "no-store")
                self.set_header("Content-Type", "text/html; charset=utf-8")

            def get(self) -> None:
                landed = outer.sign_in.land(self.get_argument("state", ""), self.get_argument("code", None),
                                            self.get_argument("iss", None), self.get_argument("error", None))
                if landed is None:  # not this sign-in's state, or used already
                    self.set_status(400)
                    self.finish("<p>No sign-in in progress matches this link.</p>")
                    return
                outer.landed = True
                self.finish(f"<p>Signed in to {html.escape(server)} for relay. You can close this tab.</p>")

            def log_exception(self, *args: Any) -> None:  # never a query string (the code) in a log
                return None

        self.landed = False
        self.sign_in: Any = None
        """The :class:`BrokerSignIn` the redirect is handed to (made once the port, so the redirect URI, is known)."""
        sockets = bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.http = HTTPServer(Application([(r"/callback", Handler)], log_function=lambda _h: None))
        self.http.add_sockets(sockets)

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/callback"

    def stop(self) -> None:
        self.http.stop()


async def _sign_in(args: argparse.Namespace) -> int:
    from ..broker.mcp_signin import oauth_dir
    from ..mcp.config import HttpServerConfig, McpConfig, load_config
    from ..mcp.registry import McpRegistry
    from ..mcp.signin import BrokerSignIn
    from .tools import _only

    config = _only(load_config(args.config), args.server)
    cfg = config.servers[args.server]
    if not isinstance(cfg, HttpServerConfig):
        raise ConfigRefusal(Code.CONFIG_INVALID, f"MCP server {args.server!r} is a stdio server: only HTTP servers "
                                                 "(an mcp.json entry with a url) sign in")
    if any(k.lower() == "authorization" for k in cfg.headers):
        raise ConfigRefusal(Code.CONFIG_INVALID, f"MCP server {args.server!r} has an Authorization header in mcp.json: "
                                                 "remove it to sign in with OAuth instead")
    if not 0 < args.timeout <= 3600:
        raise ConfigRefusal(Code.CONFIG_INVALID, "--timeout must be between 0 and 3600 seconds")
    callback = None
    registry: McpRegistry | None = None
    try:
        callback = _Callback(args.server)
        sign_in = callback.sign_in = BrokerSignIn(oauth_dir(Path(args.data_dir) if args.data_dir else None),
                                                  callback.redirect_uri)
        # a registration made for another redirect (the Jupyter server's route, an earlier terminal sign-in on
        # another port) would make the authorization server refuse this one: register again
        sign_in.store(cfg.name, cfg.url).forget_client_unless(callback.redirect_uri)
        registry = McpRegistry(McpConfig(servers={cfg.name: cfg}, path=config.path), None,
                               connect_timeout=30.0, call_timeout=30.0, shutdown_grace=0.5)
        registry.enable_sign_in(sign_in)
        pending = await registry.start_sign_in(cfg.name, timeout=args.timeout)
        if pending.url.done() and not pending.url.cancelled() and pending.outcome is None:
            url = pending.url.result()
            print(f"Sign in to the MCP server {cfg.name} on its authorization page ({urlsplit(url).hostname}): "
                  f"open this link in a browser on this machine\n{url}", flush=True)
            if args.open:
                import webbrowser

                webbrowser.open(url)
            print(f"waiting up to {args.timeout:g} s for the redirect to {callback.redirect_uri} ...", flush=True)
        if pending.task is not None:
            await pending.task
        if pending.outcome == "signed_in":
            print(f"✓ {pending.message}; the tokens are in {sign_in.directory} (0600). A running daemon connects "
                  "the server on its next tools listing or run.")
            return 0
        print(f"✗ sign-in to {cfg.name} failed: {pending.message or 'no authorization link came'}", file=sys.stderr)
        return 1
    finally:
        if registry is not None:
            await registry.stop()
        if callback is not None:
            callback.stop()


def _cmd_signin(args: argparse.Namespace) -> int:
    return asyncio.run(_sign_in(args))
