"""OAuth sign-in for Streamable HTTP MCP servers, switched on: the person signs in, the broker keeps the tokens.

The MCP SDK's :class:`~mcp.client.auth.OAuthClientProvider` (``mcp/oauth.py``) does the protocol:
protected-resource and authorization-server metadata discovery, dynamic client registration,
authorization code with PKCE, the ``resource`` parameter, token refresh. When it needs a person it calls
its redirect handler with the authorization URL and awaits its callback handler for the code. Here:

- :class:`BrokerSignIn` is that pair for every HTTP server of the registry. A sign-in happens only when
  the user asked for one (:meth:`McpRegistry.start_sign_in`, RPC ``mcp.sign_in`` from a notebook: the
  card with the link); a connection that needs one otherwise fails at once with "needs sign-in" (a
  background connect never waits for a person, nor opens anything).
- The redirect lands on the Jupyter server (``{base_url}relay/mcp-oauth/callback``, a route behind
  Jupyter's login: ``server/mcp_oauth_handler.py``), which hands ``code`` and ``state`` to
  :meth:`BrokerSignIn.land`. Only a ``state`` of a sign-in in progress is accepted; each is used once.
- Tokens and the registered client go to :class:`~relay_jupyter.mcp.oauth.FileTokenStore` (0600 files in a
  0700 ``<data dir>/mcp-oauth/``): never in the kernel, an event, a log line, a message or the audit. The
  authorization URL the card shows carries the PKCE *challenge* and the state, never the verifier, so the
  link saved in a notebook's output cannot be turned into a token.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mcp.shared.auth import AuthorizationCodeResult

from .oauth import REDIRECT_PATH, FileTokenStore, oauth_provider
from .policy import is_loopback_host

__all__ = ["REDIRECT_PATH", "BrokerSignIn", "SignInNeeded", "SignInPending"]

logger = logging.getLogger(__name__)

#: How long a started sign-in waits for the person (the card says so); then it fails and can be started again.
DEFAULT_SIGN_IN_TIMEOUT = 600.0


class SignInNeeded(Exception):
    """Raised inside the SDK's flow when a server needs a person and no sign-in was asked for."""


@dataclass
class SignInPending:
    """One sign-in in progress: the URL for the card, then the code from the redirect."""

    server: str
    sign_in_id: str = field(default_factory=lambda: "si_" + secrets.token_hex(8))
    url: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    code: asyncio.Future[AuthorizationCodeResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    state: str | None = None
    task: asyncio.Task[Any] | None = None
    outcome: str | None = None
    """``signed_in`` | ``failed`` | ``denied`` | ``timeout`` once over."""
    message: str = ""


class BrokerSignIn:
    """The SDK's redirect/callback handlers for every HTTP MCP server of one broker (see the module doc)."""

    def __init__(self, directory: Path, redirect_uri: str, *, interactive: bool = True,
                 how_to: str = "sign in from a notebook with relay.sign_in({name!r})") -> None:
        self.directory = Path(directory)
        self.redirect_uri = redirect_uri
        self.interactive = interactive
        """False on the standalone daemon: it has no redirect route, so it only uses tokens stored by a sign-in
        made elsewhere (``jupyter relay mcp-signin SERVER`` at a terminal); ``mcp.sign_in`` is refused there."""
        self.how_to = how_to
        """The one-line instruction a "needs sign-in" message ends with (``{name}`` is the server's name)."""
        self._active: dict[str, SignInPending] = {}
        self._by_state: dict[str, SignInPending] = {}
        self._by_id: dict[str, SignInPending] = {}

    # -- the SDK side (mcp/oauth.SignIn) -----------------------------------------------------------

    async def redirect(self, server: str, authorization_url: str) -> None:
        pending = self._active.get(server)
        if pending is None:
            raise SignInNeeded(server)
        parts = urlsplit(authorization_url)
        # the person's browser opens this link: https, or http to loopback only (the endpoint policy's rule)
        if not (parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(parts.hostname or ""))) \
                or parts.username or parts.password:
            self.finish(pending, "failed", f"the authorization page of {server!r} is not https; refused")
            raise SignInNeeded(server)
        state = (parse_qs(parts.query).get("state") or [None])[0]
        if not state:  # the SDK always sends one; without it the callback could not be matched
            raise SignInNeeded(server)
        pending.state = state
        self._by_state[state] = pending
        if not pending.url.done():
            pending.url.set_result(authorization_url)

    async def callback(self, server: str) -> AuthorizationCodeResult:
        pending = self._active.get(server)
        if pending is None:
            raise SignInNeeded(server)
        return await pending.code

    def provider_for(self, config: Any) -> Any:
        """``McpConnection.http_auth``: the SDK's provider for this server, tokens in its 0600 file. Where no
        sign-in can happen here (the daemon) and none was stored, no provider at all: the server's 401 is "needs
        sign-in" at once, with no client registered at the authorization server and nothing written."""
        store = self.store(config.name, config.url)
        if not self.interactive and "tokens" not in store._read():
            return None
        return oauth_provider(config.name, config.url, store, self)

    def store(self, server: str, url: str) -> FileTokenStore:
        return FileTokenStore(self.directory, server, url)

    # -- the person's side -------------------------------------------------------------------------

    def begin(self, server: str) -> SignInPending:
        """A sign-in for ``server`` (an earlier one still open for it is replaced: its link stops working)."""
        old = self._active.pop(server, None)
        if old is not None:
            self._drop(old)
            if not old.code.done():
                old.code.set_exception(SignInNeeded(server))
        pending = SignInPending(server)
        self._active[server] = pending
        self._by_id[pending.sign_in_id] = pending
        return pending

    def active(self, server: str) -> SignInPending | None:
        """The sign-in in progress for ``server`` (None when none is)."""
        return self._active.get(server)

    def get(self, sign_in_id: str) -> SignInPending | None:
        return self._by_id.get(sign_in_id)

    def finish(self, pending: SignInPending, outcome: str, message: str = "") -> None:
        pending.outcome, pending.message = outcome, message
        if self._active.get(pending.server) is pending:
            del self._active[pending.server]
        self._drop(pending)

    def _drop(self, pending: SignInPending) -> None:
        if pending.state is not None:
            self._by_state.pop(pending.state, None)

    def land(self, state: str, code: str | None, iss: str | None = None, error: str | None = None) -> str | None:
        """The redirect arrived (``server/mcp_oauth_handler.py``): hand the code to the waiting flow. Returns
        the server's name, or None when no sign-in in progress has this ``state`` (used once)."""
        pending = self._by_state.pop(state, None) if isinstance(state, str) and state else None
        if pending is None or pending.code.done():
            return None
        if error or not code:
            pending.code.set_exception(PermissionError(f"the authorization server answered {error or 'no code'}"))
        else:
            pending.code.set_result(AuthorizationCodeResult(code=code, state=state, iss=iss))
        return pending.server
