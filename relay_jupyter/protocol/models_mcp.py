"""Wire models of ``mcp.*`` (docs/protocol.md): OAuth sign-in to an HTTP MCP server; MCP prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .strict import Strict

__all__ = ["McpPromptArgument", "McpPromptGetParams", "McpPromptGetResult", "McpPromptInfo", "McpPromptMessage",
           "McpPromptsListParams", "McpPromptsListResult", "McpServerParams", "McpSignInResult",
           "McpSignInWaitParams", "McpSignInsEntry", "McpSignInsResult", "McpSignOutResult"]

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


class McpSignInsEntry(Strict):
    """One HTTP MCP server that signs in with OAuth here, for the side panel's "Sign in to <server>" list."""

    server: str
    host: str
    """The server's host (the panel names it; the URL's path and query are not shown)."""
    state: Literal["needs_sign_in", "pending", "signed_in", "unavailable", "not_connected"]
    has_token: bool
    """Whether the broker holds a token for it (never the token)."""
    sign_in_id: str | None = None
    authorization_url: str | None = None
    """``pending`` only: the link of the sign-in in progress (as ``mcp.sign_in`` answered it)."""
    message: str = ""


class McpSignInsResult(Strict):
    servers: list[McpSignInsEntry]


# -- prompts (``%agent --prompt server:name``; docs/mcp.md "Prompts") ---------------------------------------------

class McpPromptsListParams(Strict):
    server: str | None = Field(default=None, min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
    """One server; None: every server the caller's grant reaches."""
    origin: str | None = Field(default=None, min_length=1, max_length=4096)
    """Browser only: the notebook the listing is for (its grant decides which servers)."""


class McpPromptArgument(Strict):
    name: str
    description: str = ""
    required: bool = False


class McpPromptInfo(Strict):
    server: str
    name: str
    description: str = ""
    arguments: list[McpPromptArgument] = Field(default_factory=list)


class McpPromptsListResult(Strict):
    prompts: list[McpPromptInfo]
    problems: dict[str, str] = Field(default_factory=dict)
    """Server name -> one line, for a server whose prompts could not be listed (unreachable, ...)."""


class McpPromptGetParams(Strict):
    server: str = _SERVER
    name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Prompt argument values (strings, as MCP has them): names of at most 100, values of at most 8 KiB."""
    origin: str | None = Field(default=None, min_length=1, max_length=4096)
    """Browser only: the notebook the prompt is for."""


class McpPromptMessage(Strict):
    role: str
    text: str


class McpPromptGetResult(Strict):
    server: str
    name: str
    messages: list[McpPromptMessage]
    text: str
    """The messages as one request (a lone user message is its text; otherwise ``[role]`` headed blocks)."""
    truncated: bool = False
