"""Conversation history as the runtime stores it, and the in-memory store used by tests.

A conversation is a list of normalized messages (see ``backends.base``), each with ``turn``: the
index of the ``%%agent`` cell run that produced it. Forking at turn *n* drops turn *n* and every
later one, so re-running an earlier cell replaces its turn. The durable store is
``storage.sqlite.Store``; anything with the methods of :class:`ConversationStore` works.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Protocol, runtime_checkable

__all__ = ["ConversationStore", "MemoryConversations", "next_turn", "fork_history"]


@runtime_checkable
class ConversationStore(Protocol):
    def load_conversation(self, conversation: str) -> list[dict[str, Any]] | None:
        """The stored messages, or None when the conversation does not exist."""
    def save_conversation(self, conversation: str, origin: str, messages: list[dict[str, Any]]) -> None:
        """Replace the stored messages (insert when new)."""
    def delete_conversation(self, conversation: str) -> bool: ...
    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """``[{conversation, origin, turns, updated_at}]``, newest first."""


def next_turn(history: list[dict[str, Any]]) -> int:
    """The turn number a new prompt gets (0 for an empty conversation)."""
    turns = [m.get("turn") for m in history if isinstance(m.get("turn"), int)]
    return max(turns) + 1 if turns else 0


def fork_history(history: list[dict[str, Any]], at_turn: int) -> list[dict[str, Any]]:
    """``history`` without turn ``at_turn`` and everything after it."""
    return [m for m in history if not (isinstance(m.get("turn"), int) and m["turn"] >= at_turn)]


class MemoryConversations:
    """A :class:`ConversationStore` in a dict (tests, benchmarks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, Any]] = {}

    def load_conversation(self, conversation: str) -> list[dict[str, Any]] | None:
        """Copy of the stored messages, or None."""
        with self._lock:
            row = self._rows.get(conversation)
            return copy.deepcopy(row["messages"]) if row else None

    def save_conversation(self, conversation: str, origin: str, messages: list[dict[str, Any]]) -> None:
        """Replace the stored messages."""
        with self._lock:
            self._rows[conversation] = {"origin": origin, "messages": copy.deepcopy(messages),
                                        "updated_at": time.time()}

    def delete_conversation(self, conversation: str) -> bool:
        """Remove; True when it existed."""
        with self._lock:
            return self._rows.pop(conversation, None) is not None

    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """Newest first."""
        with self._lock:
            rows = [{"conversation": cid, "origin": r["origin"], "turns": next_turn(r["messages"]),
                     "updated_at": r["updated_at"]} for cid, r in self._rows.items()
                    if origin is None or r["origin"] == origin]
        return sorted(rows, key=lambda r: r["updated_at"], reverse=True)
