"""Wire models of ``mcp.*`` (docs/protocol.md): OAuth sign-in to an HTTP MCP server."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .strict import Strict

__all__ = ["McpServerParams", "McpSignInResult", "McpSignInWaitParams", "McpSignOutResult"]

_SERVER = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


class McpServerParams(Strict):
    server: str = _SERVER


class McpSignInWaitParams(Strict):
    sign_in_id: str = Field(min_length=1, max_length=64)
    timeout: float = Field(default=25.0, ge=0, le=60)
    """Seconds to wait for the person before answering ``pending`` (ask again)."""


class McpSignInResult(Strict):
    sign_in_id: str
    server: str
    state: Literal["pending", "signed_in", "failed"]
    authorization_url: str | None = None
    """The link the card shows (``pending`` only): the authorization server's page, with the PKCE challenge
    and the state; the verifier and every token stay in the broker."""
    message: str = ""


class McpSignOutResult(Strict):
    server: str
    signed_out: bool
