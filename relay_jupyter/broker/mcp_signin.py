"""OAuth sign-in to HTTP MCP servers, switched on for a broker (docs/mcp.md, "OAuth sign-in").

:func:`enable_mcp_sign_in` gives the broker's MCP registry a :class:`~relay_jupyter.mcp.signin.BrokerSignIn`
whose redirect URI is the Jupyter server's ``{base_url}relay/mcp-oauth/callback`` and whose tokens live in
``<data dir>/mcp-oauth/`` (0700; one 0600 file per server and URL). Only the Jupyter server calls it: the
redirect needs a route a browser reaches, so the standalone daemon has no OAuth sign-in (a 401 there says
"needs sign-in", and a header token in mcp.json still works).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..mcp.signin import BrokerSignIn

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["enable_mcp_sign_in", "sign_in_of"]

_sign_ins: weakref.WeakKeyDictionary[Any, BrokerSignIn] = weakref.WeakKeyDictionary()


def enable_mcp_sign_in(broker: Broker, redirect_uri: str, directory: Path | None = None) -> BrokerSignIn | None:
    """Switch OAuth sign-in on for ``broker``'s HTTP MCP servers (before the registry connects). None when the
    broker has no MCP registry."""
    if broker.mcp is None:
        return None
    if directory is None:
        from ..storage.paths import data_dir, ensure_private_dir

        root = ensure_private_dir(Path(broker.config.data_dir)) if broker.config.data_dir else data_dir()
        directory = root / "mcp-oauth"
    sign_in = BrokerSignIn(directory, redirect_uri)
    broker.mcp.enable_sign_in(sign_in)
    _sign_ins[broker] = sign_in
    return sign_in


def sign_in_of(broker: Broker) -> BrokerSignIn | None:
    """The broker's sign-in, or None when OAuth sign-in is not switched on (the daemon, tests)."""
    return _sign_ins.get(broker)
