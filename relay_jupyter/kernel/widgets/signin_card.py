"""The sign-in card: an HTTP MCP server needs the user to sign in with OAuth (docs/mcp.md, "OAuth sign-in").

It shows the server's name, the host of the authorization page and the link; the person opens it, signs
in there, and the authorization server sends the browser back to the Jupyter server (relay's redirect
route), where the broker finishes the exchange and keeps the token. The kernel never sees a token: the
card gets only the link (which carries the PKCE challenge and a one-time state, never the verifier).
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from ..rendering import chrome_html, visible
from .base import esc, html_widget, show, update

__all__ = ["SignInCard", "signin_text"]


def signin_text(server: str, url: str | None, status: str) -> str:
    """Text fallback of the card (saved notebooks, terminals)."""
    link = f" open: {url}" if url else ""
    return visible(f"relay: sign in to the MCP server {server!r}:{link} ({status})")


class SignInCard:
    """``SignInCard(server, url).show()``; :meth:`done` when the broker reports the outcome."""

    def __init__(self, server: str, url: str | None) -> None:
        self.server = server
        self.url = url
        self.display_id = f"relay-signin-{uuid.uuid4().hex}"
        self.widget: Any = None

    def _fragment(self, status_html: str) -> str:
        host = urlsplit(self.url).hostname if self.url else None
        # a new tab: in the same tab the sign-in page (and relay's callback after it) replaced JupyterLab
        link = (f'<p><a href="{esc(self.url)}" target="_blank">Sign in to {esc(self.server)}</a> '
                f"(the page of <b>{esc(host or '?')}</b>; it opens the server's own sign-in, not relay's)</p>"
                if self.url else "")
        return (f"<div class='relay-card'><b>🔑 The MCP server <code>{esc(self.server)}</code> needs you to "
                f"sign in</b>{link}<p>{status_html}</p><p><i>relay keeps the token in the broker; it never "
                "reaches this notebook.</i></p></div>")

    def show(self) -> None:
        self.widget = html_widget(self._fragment("Waiting for the sign-in…"))
        show(self.widget, signin_text(self.server, self.url, "waiting"), self.display_id)

    def done(self, ok: bool, message: str) -> None:
        status = ("✓ " if ok else "✗ ") + message
        if self.widget is not None:
            self.widget.value = chrome_html(self._fragment(esc(status)))
            update(self.widget, signin_text(self.server, None, status), self.display_id)
