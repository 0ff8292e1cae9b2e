"""OAuth sign-in to HTTP MCP servers, switched on for a broker (docs/mcp.md, "OAuth sign-in").

:func:`enable_mcp_sign_in` gives the broker's MCP registry a :class:`~relay_jupyter.mcp.signin.BrokerSignIn`
whose redirect URI is the Jupyter server's ``{base_url}relay/mcp-oauth/callback`` and whose tokens live in
``<data dir>/mcp-oauth/`` (0700; one 0600 file per server and URL). The standalone daemon has no route a browser
reaches: :func:`enable_daemon_mcp_sign_in` switches on the *use* of stored tokens there (refreshed by the SDK),
with "needs sign-in" naming ``jupyter relay mcp-signin SERVER``, the terminal command that signs in with a
loopback redirect of its own (``cli/mcp_signin.py``); ``mcp.sign_in`` is refused on the daemon.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..mcp.signin import BrokerSignIn
    from .broker import Broker

# mcp.signin imports the MCP SDK (about 1.3 s of CPU): imported by enable_mcp_sign_in, once a broker has an MCP
# registry, not by every broker start (broker/methods/mcp.py imports this module; issue 19 "Daemon start")

__all__ = ["DAEMON_HOW_TO", "announce_sign_in", "enable_daemon_mcp_sign_in", "enable_mcp_sign_in", "oauth_dir",
           "sign_in_changed", "sign_in_of"]

log = logging.getLogger(__name__)

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


def sign_in_changed(broker: Broker, server: str, state: str, origin: str | None) -> None:
    """One ``mcp.sign_in_changed {server, state}`` (see :func:`announce_sign_in`); ``signed_out`` after
    ``mcp.sign_out``. Never raises: a failing event store is logged."""
    from ..protocol.names import EventType

    try:
        broker.events.append(EventType.MCP_SIGN_IN_CHANGED, {"server": server, "state": state}, origin=origin)
    except Exception:
        log.exception("relay: could not emit mcp.sign_in_changed for %s", server)


def announce_sign_in(broker: Broker, pending: Any, origin: str | None) -> None:
    """Emit ``mcp.sign_in_changed {server, state}`` for a sign-in ``mcp.sign_in`` started: ``pending`` now (when
    its flow still waits for the person), then ``signed_in`` / ``failed`` when the flow ends (replaced, timed
    out, denied: ``failed``). The side panel reads ``mcp.sign_ins`` again on it instead of polling. Only the
    server's name and the state: never the authorization URL, the state parameter, a code or a token (the link
    stays behind ``mcp.sign_ins``, an authenticated call). Sent with the origin the call acted on: a cell's
    sign-in reaches that notebook's kernels and the browser sessions of the server's user; the panel's own
    (acting on every origin, ``origin`` None) is a broadcast of this Jupyter server, whose one user it is. A
    failing event store is logged and leaves the sign-in as it is (the panel then sees it at its next snapshot)."""

    def emit(state: str) -> None:
        sign_in_changed(broker, pending.server, state, origin)

    def ended(_task: Any) -> None:
        emit("signed_in" if pending.outcome == "signed_in" else "failed")

    task = pending.task
    if task is None:  # no flow (never the case from start_sign_in): its state is what it is now
        emit("pending" if pending.outcome is None else
             "signed_in" if pending.outcome == "signed_in" else "failed")
        return
    if not task.done():
        emit("pending")
    task.add_done_callback(ended)
