"""Conversation history as the runtime stores it.

A conversation is a list of normalized messages (see ``backends.base``), each with ``turn``: the
index of the ``%%agent`` cell run that produced it. Forking at turn *n* drops turn *n* and every
later one, so re-running an earlier cell replaces its turn.

The store is append-only (``core.ports.ConversationStore``: a row per message): a run loads its
history once, at its start, and then writes only what it adds (:class:`HistoryWriter`), so a turn
costs what it adds, not what came before (issue 18). ``MemoryConversations`` is the in-memory store
(``core.memory.MemoryStore``), for tests and benchmarks.
"""

from __future__ import annotations

from typing import Any

from ..core.memory import MemoryStore
from ..core.ports import ConversationStore

__all__ = ["ConversationStore", "HistoryWriter", "MemoryConversations", "cell_fork", "fork_history", "next_turn",
           "turn_cells"]

MemoryConversations = MemoryStore


class HistoryWriter:
    """Writes a run's history to the store append-only: the messages not yet stored, from the first
    one that changed. ``stored`` is how many messages of the history the store holds as they are."""

    def __init__(self, store: ConversationStore, conv_id: str, origin: str, stored: int = 0) -> None:
        self.store, self.conv_id, self.origin = store, conv_id, origin
        self.stored = stored

    def save(self, history: list[dict[str, Any]], name: str, meta: dict[str, Any]) -> None:
        """Store ``history`` (which extends what was stored: the runtime only appends to it).

        When the store holds fewer messages than this writer wrote (a transaction around an earlier
        save rolled back, e.g. a full disk at a run's end), the whole history is written again."""
        start = min(self.stored, len(history))
        try:
            self.store.append_messages(self.conv_id, self.origin, name, start, history[start:], meta)
        except ValueError:
            self.store.save_conversation(self.conv_id, self.origin, name, history, meta)
        self.stored = len(history)


def next_turn(history: list[dict[str, Any]]) -> int:
    """The turn number a new prompt gets (0 for an empty conversation)."""
    turns = [m.get("turn") for m in history if isinstance(m.get("turn"), int)]
    return max(turns) + 1 if turns else 0


def fork_history(history: list[dict[str, Any]], at_turn: int) -> list[dict[str, Any]]:
    """``history`` without turn ``at_turn`` and everything after it."""
    return [m for m in history if not (isinstance(m.get("turn"), int) and m["turn"] >= at_turn)]


def turn_cells(history: list[dict[str, Any]]) -> list[str | None]:
    """The notebook cell id of each turn of ``history`` (``run.start`` ``cell_id``, kept on the turn's
    messages), in turn order; None for a turn run without one."""
    cells: dict[int, str | None] = {}
    for m in history:
        turn = m.get("turn")
        if isinstance(turn, int) and not isinstance(turn, bool):
            cell = m.get("cell_id")
            if cells.get(turn) is None:
                cells[turn] = cell if isinstance(cell, str) else None
    return [cells.get(t) for t in range(next_turn(history))]


def cell_fork(history: list[dict[str, Any]], cell_id: str | None) -> tuple[list[dict[str, Any]], int | None]:
    """``(history, at)``: when a turn of ``history`` was run by the cell ``cell_id``, the history without that
    turn and every later one, and that turn's number; else ``history`` unchanged and None."""
    if cell_id is None:
        return history, None
    for m in history:
        turn = m.get("turn")
        if m.get("cell_id") == cell_id and isinstance(turn, int) and not isinstance(turn, bool):
            return fork_history(history, turn), turn
    return history, None
