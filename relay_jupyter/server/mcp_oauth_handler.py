"""``{base_url}relay/mcp-oauth/callback``: where an MCP server's authorization server sends the browser back
after the user signed in (docs/mcp.md, "OAuth sign-in"; the flow in ``mcp/signin.py``).

Behind Jupyter's login (``@web.authenticated``: a browser that is not logged in is sent to the login page
first), so a page elsewhere cannot land a code of its own choosing in the user's broker. The ``state``
must be the one of a sign-in in progress (each is used once); the ``code`` goes to the SDK's waiting flow,
which exchanges it with the PKCE verifier the broker alone holds. The page shows the server's name (escaped)
and never a code or a token; the URL (with its ``code``) is not logged by relay (Jupyter's access log scrubs
``code`` and ``state`` too: ``jupyter_server.log`` masks them only for some names, so the handler clears the
query from its own log line).
"""

from __future__ import annotations

import html

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from tornado import web

from ..broker.mcp_signin import sign_in_of
from .handlers import AUTH_RESOURCE

__all__ = ["McpOAuthCallbackHandler", "mcp_oauth_handlers"]

_PAGE = ("<!doctype html><html><head><meta charset='utf-8'><title>relay: MCP sign-in</title></head>"
         "<body style='font-family: sans-serif; margin: 3em'><h2>{title}</h2><p>{text}</p></body></html>")


class McpOAuthCallbackHandler(JupyterHandler):
    auth_resource = AUTH_RESOURCE

    def _page(self, status: int, title: str, text: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")  # the code must not leave in a Referer header
        self.finish(_PAGE.format(title=html.escape(title), text=html.escape(text)))

    @web.authenticated
    @authorized
    async def get(self) -> None:
        broker = self.settings.get("relay_broker")
        sign_in = sign_in_of(broker) if broker is not None else None
        state = self.get_query_argument("state", "")
        code = self.get_query_argument("code", None)
        error = self.get_query_argument("error", None)
        if sign_in is None:
            self._page(404, "No MCP sign-in here", "OAuth sign-in is not switched on in this server.")
            return
        server = sign_in.land(state[:512], code[:4096] if code else None, self.get_query_argument("iss", None),
                              error[:200] if error else None)
        if server is None:
            self._page(400, "This sign-in is not waiting",
                       "No sign-in in progress matches this answer (it was used already, replaced or timed out). "
                       "Start it again from the notebook.")
            return
        if error or not code:
            self._page(200, f"Sign-in to {server} was not completed",
                       f"The authorization server answered: {(error or 'no code')[:200]}. You can close this tab.")
            return
        self._page(200, f"Signed in to {server}", "relay holds the token now. You can close this tab and go back "
                                                   "to the notebook.")


def mcp_oauth_handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes relative to the server's base_url."""
    return [(r"/relay/mcp-oauth/callback", McpOAuthCallbackHandler)]
