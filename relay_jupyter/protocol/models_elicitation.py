"""Wire models of ``elicitation.*`` (docs/protocol.md): answering an MCP server's question."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .strict import Strict

__all__ = ["ElicitationAnswerParams", "ElicitationAnswerResult", "ElicitationPendingResult"]


class ElicitationAnswerParams(Strict):
    request_id: str = Field(min_length=1, max_length=200)
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = Field(default=None, max_length=64)
    """The form's values (accept only); checked against the request's fields by the broker."""


class ElicitationAnswerResult(Strict):
    request_id: str
    action: str
    answered_by: str


class ElicitationPendingResult(Strict):
    requests: list[dict[str, Any]]
    """The ``elicitation.request`` event data of every pending question the caller may answer, each
    with its ``event_id``."""
