"""OAuth sign-in to HTTP MCP servers, switched on for a broker (docs/mcp.md, "OAuth sign-in").

:func:`enable_mcp_sign_in` gives the broker's MCP registry a :class:`~relay_jupyter.mcp.signin.BrokerSignIn`
whose redirect URI is the Jupyter server's ``{base_url}relay/mcp-oauth/callback`` and whose tokens live in
``<data dir>/mcp-oauth/`` (0700; one 0600 file per server and URL). The standalone daemon has no route a browser
reaches: :func:`enable_daemon_mcp_sign_in` switches on the *use* of stored tokens there (refreshed by the SDK),
with "needs sign-in" naming ``jupyter relay mcp-signin SERVER``, the terminal command that signs in with a
loopback redirect of its own (``cli/mcp_signin.py``); ``mcp.sign_in`` is refused on the daemon.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..mcp.signin import BrokerSignIn
    from .broker import Broker

# mcp.signin imports the MCP SDK (about 1.3 s of CPU): imported by enable_mcp_sign_in, once a broker has an MCP
# registry, not by every broker start (broker/methods/mcp.py imports this module; issue 19 "Daemon start")

__all__ = ["DAEMON_HOW_TO", "enable_daemon_mcp_sign_in", "enable_mcp_sign_in", "oauth_dir", "sign_in_of"]

#: What a "needs sign-in" message on the daemon tells the user to do.
DAEMON_HOW_TO = "sign in at a terminal with: jupyter relay mcp-signin {name}"

_sign_ins: weakref.WeakKeyDictionary[Any, BrokerSignIn] = weakref.WeakKeyDictionary()


def oauth_dir(data_dir: Path | None) -> Path:
    """``<data dir>/mcp-oauth``: where the OAuth tokens of MCP servers live (the Jupyter server, the daemon and
    ``jupyter relay mcp-signin`` share it)."""
    from ..storage.paths import data_dir as default_data_dir
    from ..storage.paths import ensure_private_dir

    root = ensure_private_dir(Path(data_dir)) if data_dir else default_data_dir()
    return root / "mcp-oauth"


def enable_mcp_sign_in(broker: Broker, redirect_uri: str, directory: Path | None = None, *,
                       interactive: bool = True, how_to: str | None = None) -> BrokerSignIn | None:
    """Switch OAuth sign-in on for ``broker``'s HTTP MCP servers (before the registry connects). None when the
    broker has no MCP registry."""
    if broker.mcp is None:
        return None
    from ..mcp.signin import BrokerSignIn

    if directory is None:
        directory = oauth_dir(broker.config.data_dir)
    extra = {"how_to": how_to} if how_to is not None else {}
    sign_in = BrokerSignIn(directory, redirect_uri, interactive=interactive, **extra)
    broker.mcp.enable_sign_in(sign_in)
    _sign_ins[broker] = sign_in
    return sign_in


def sign_in_of(broker: Broker) -> BrokerSignIn | None:
    """The broker's sign-in, or None when OAuth sign-in is not switched on (the daemon, tests)."""
    return _sign_ins.get(broker)


def enable_daemon_mcp_sign_in(broker: Broker) -> BrokerSignIn | None:
    """The daemon's part: use the tokens ``jupyter relay mcp-signin`` stored (no sign-in of its own; the redirect
    URI is only the placeholder a background connect would register with)."""
    return enable_mcp_sign_in(broker, "http://127.0.0.1/relay-mcp-signin", interactive=False, how_to=DAEMON_HOW_TO)
