"""Wire models of ``run.start``, ``run.cancel`` and ``conversations.*`` (strict: unknown fields -> -32602)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from .run_choices import PROFILE_NAME_PATTERN, BackendName, EngineName
from .strict import Strict

__all__ = [
    "Attachment",
    "RunStartParams",
    "RunStartResult",
    "RunCancelParams",
    "RunCancelResult",
    "ConversationsListParams",
    "ConversationsListResult",
    "ConversationsForkParams",
    "ConversationsForkResult",
    "ConversationsDeleteParams",
    "ConversationsDeleteResult",
    "MAX_PROMPT_CHARS",
    "CONVERSATION_NAME_PATTERN",
    "CELL_ID_PATTERN",
    "PROFILE_NAME_PATTERN",
    "ConversationName",
    "BackendName",
    "EngineName",
]

#: Largest prompt, and largest single attachment, in characters.
MAX_PROMPT_CHARS = 1_000_000

_ID = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@#/\-]+$")
#: The one pattern of a conversation name, in every params model that takes one (run.start,
#: conversations.*, tools.call, tools.list, workspace.diff). No ``|``, quotes or spaces: the broker
#: keys a conversation by the pair (origin, name), never by a joined string (broker/conversation_keys).
CONVERSATION_NAME_PATTERN = r"^[A-Za-z0-9._:@#/\-]{1,200}$"
ConversationName = Annotated[str, Field(min_length=1, max_length=200, pattern=CONVERSATION_NAME_PATTERN)]
#: nbformat 4.5's cell id schema (``^[a-zA-Z0-9-_]+$``, 1-64 characters).
CELL_ID_PATTERN = r"^[a-zA-Z0-9_\-]{1,64}$"


_Strict = Strict  # the one base of the wire models (protocol/strict.py)


class Attachment(_Strict):
    """Untrusted material sent with a prompt (a DataFrame summary, a file); labeled in the context."""

    label: str = Field(max_length=200)
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class RunStartParams(_Strict):
    conversation: ConversationName
    """Conversation id (one per notebook cell chain); a run appends a turn to it."""
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    attachments: list[Attachment] = Field(default_factory=list, max_length=32)
    model: str | None = Field(None, min_length=1, max_length=200)
    """Model id; default: the server's ``default_model``."""
    backend: BackendName | None = None
    """Default: the server's ``default_backend``."""
    engine: EngineName | None = None
    """What drives the run (``docs/engines.md``); default: the server's ``default_engine``."""
    profile: str | None = Field(None, pattern=PROFILE_NAME_PATTERN)
    """A named upstream (``c.RelayApp.profiles``, docs/proxy.md) the run's model requests go to; the grant
    must list it. Default: the broker's own backends."""
    mode: Literal["ask", "review", "full"] = "ask"
    max_tokens: int | None = Field(None, ge=1, le=128_000)
    tools: list[str] | None = Field(None, max_length=500)
    """Offer only these tools (still gated by the grant); None = every available tool."""
    origin: str | None = None
    """Browser sessions only: the notebook to run for. Kernels always run for themselves."""
    cell_id: str | None = Field(None, min_length=1, max_length=64, pattern=CELL_ID_PATTERN)
    """The nbformat 4.5 id of the notebook cell that runs this turn. Stored with the turn; a conversation
    that already holds a turn of this cell is forked there first (that turn and every later one dropped), so
    a re-run after a kernel restart replaces its turn (docs/provenance.md "Lineage")."""


class RunStartResult(_Strict):
    run_id: str


class RunCancelParams(_Strict):
    run_id: str = Field(min_length=1, max_length=100)


class RunCancelResult(_Strict):
    cancelled: bool
    """False when the run had already ended."""


class ConversationsListParams(_Strict):
    origin: str | None = None


class ConversationsListResult(_Strict):
    conversations: list[dict[str, Any]]
    """``{conv_id, origin, name, message_count, meta, created_at, updated_at}``, newest first."""


class ConversationsForkParams(_Strict):
    conversation: ConversationName
    at_turn: int = Field(ge=0)
    """Drop this turn and every later one (re-running an earlier cell replaces its turn)."""
    origin: str | None = None


class ConversationsForkResult(_Strict):
    conversation: str
    removed_messages: int
    turns: int
    """Turns left."""


class ConversationsDeleteParams(_Strict):
    conversation: ConversationName
    origin: str | None = None


class ConversationsDeleteResult(_Strict):
    deleted: bool
    workspace_deleted: bool = False
