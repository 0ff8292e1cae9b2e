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
    """What ``storage.sqlite.Store`` offers for conversations (and :class:`MemoryConversations`)."""

    def load_conversation(self, conv_id: str) -> dict[str, Any] | None:
        """``{conv_id, origin, name, messages, meta, created_at, updated_at}`` or None."""
    def save_conversation(self, conv_id: str, origin: str, name: str, messages: list[dict[str, Any]],
                          meta: dict[str, Any]) -> None:
        """Insert or replace."""
    def delete_conversation(self, conv_id: str) -> bool: ...
    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """Summaries without messages, newest first."""


def next_turn(history: list[dict[str, Any]]) -> int:
    """The turn number a new prompt gets (0 for an empty conversation)."""
    turns = [m.get("turn") for m in history if isinstance(m.get("turn"), int)]
    return max(turns) + 1 if turns else 0


def fork_history(history: list[dict[str, Any]], at_turn: int) -> list[dict[str, Any]]:
    """``history`` without turn ``at_turn`` and everything after it."""
    return [m for m in history if not (isinstance(m.get("turn"), int) and m["turn"] >= at_turn)]


class MemoryConversations:
    """A :class:`ConversationStore` in a dict (tests, benchmarks), same shapes as the SQLite store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, Any]] = {}

    def load_conversation(self, conv_id: str) -> dict[str, Any] | None:
        """A deep copy of the stored row, or None."""
        with self._lock:
            row = self._rows.get(conv_id)
            return copy.deepcopy(row) if row else None

    def save_conversation(self, conv_id: str, origin: str, name: str, messages: list[dict[str, Any]],
                          meta: dict[str, Any]) -> None:
        """Insert or replace; ``created_at`` is kept."""
        now = time.time()
        with self._lock:
            created = self._rows.get(conv_id, {}).get("created_at", now)
            self._rows[conv_id] = {"conv_id": conv_id, "origin": origin, "name": name,
                                   "messages": copy.deepcopy(messages), "meta": copy.deepcopy(meta),
                                   "created_at": created, "updated_at": now}

    def delete_conversation(self, conv_id: str) -> bool:
        """Remove; True when it existed."""
        with self._lock:
            return self._rows.pop(conv_id, None) is not None

    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """Summaries (``message_count`` instead of messages), newest first."""
        with self._lock:
            rows = [{k: v for k, v in r.items() if k != "messages"} | {"message_count": len(r["messages"])}
                    for r in self._rows.values() if origin is None or r["origin"] == origin]
        return sorted(rows, key=lambda r: r["updated_at"], reverse=True)
