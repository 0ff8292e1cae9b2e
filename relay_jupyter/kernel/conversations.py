"""Which broker conversation a ``%%agent`` cell continues, and when re-running a cell forks it.

One conversation per notebook by default (chat ``default``), or named with ``--chat NAME``. Each
chat remembers the cell id of every turn it took. Re-running a cell that already took turn ``k``
forks the conversation there (``conversations.fork {conversation, at_turn: k}``): that turn and
everything after it are replaced -- the notebook's "undo" (seed 003: prefix kept, suffix changed ->
fork at the rollback point). ``--new`` starts a fresh conversation under the same chat name.

Turn bookkeeping lives in the kernel, and each answer's provenance in the saved notebook records its turn
and the cell ids of the turns before it (``lineage``: ``conversation``, ``turn``, ``parent_cells``;
docs/provenance.md). After a kernel
restart the book of a chat is rebuilt from the newest saved record of that chat on its first use, so
re-running a cell forks at that cell's turn and Run All reproduces the conversation's shape instead of
appending every turn again.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Chat", "ConversationBook", "restore_chat", "valid_chat_name", "wire_cell_id"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_CELL_ID = re.compile(r"^[a-zA-Z0-9_\-]{1,64}$")  # nbformat 4.5's cell id (protocol CELL_ID_PATTERN)


def wire_cell_id(cell_id: object) -> str | None:
    """The cell id ``run.start`` sends: nbformat's id as it is; another frontend's (VS Code sends the cell's
    URI, ``vscode-notebook-cell:/…#W0s…``) as a stable ``h-`` + SHA-256 prefix of it, so it fits the broker's
    pattern and still names the same cell each time; None without one."""
    if not isinstance(cell_id, str) or not cell_id:
        return None
    if _CELL_ID.match(cell_id):
        return cell_id
    return "h-" + hashlib.sha256(cell_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def valid_chat_name(name: str) -> bool:
    """Chat names are short identifiers (they become part of a conversation id)."""
    return bool(_NAME.match(name))


@dataclass
class Chat:
    name: str
    conversation: str
    turns: list[str | None] = field(default_factory=list)
    """Cell id of each turn taken, in order (None when the frontend sent no cell id)."""


class ConversationBook:
    """Chat name -> :class:`Chat`. Pure bookkeeping; the broker calls are the session's job."""

    def __init__(self, saved: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.chats: dict[str, Chat] = {}
        self.saved = saved
        """Reads the saved notebook's provenance records (``provenance.saved_records``), or None."""

    def chat(self, name: str, *, new: bool = False) -> Chat:
        """The chat to use; ``new`` replaces it with a fresh conversation. A chat this kernel has not used
        yet is rebuilt from the saved notebook when it holds a record of it (after a restart)."""
        if not new and name not in self.chats and self.saved is not None:
            restored = restore_chat(name, self.saved())
            if restored is not None:
                self.chats[name] = restored
        if new or name not in self.chats:
            conversation = name if (name not in self.chats and not new) else f"{name}-{uuid.uuid4().hex[:8]}"
            self.chats[name] = Chat(name, conversation)
        return self.chats[name]

    @staticmethod
    def fork_point(chat: Chat, cell_id: str | None) -> int | None:
        """The turn index this cell took before (so it must fork there), or None to append."""
        if cell_id is None:
            return None
        try:
            return chat.turns.index(cell_id)
        except ValueError:
            return None

    @staticmethod
    def record(chat: Chat, at: int | None, cell_id: str | None) -> int:
        """Record that ``cell_id`` took a turn (replacing turn ``at`` and later ones). Returns its index."""
        if at is not None:
            del chat.turns[at:]
        chat.turns.append(cell_id)
        return len(chat.turns) - 1


def restore_chat(name: str, records: list[dict[str, Any]]) -> Chat | None:
    """The chat ``name`` as the newest saved answer of it left it: its conversation and the cell id of each
    turn (its ``lineage.parent_cells`` then its own cell). None when no usable record exists (an older record without a
    turn, a malformed one: then the chat starts as before, appending)."""
    best: dict[str, Any] | None = None
    for record in records:
        if not isinstance(record, dict) or record.get("chat") != name or not isinstance(record.get("lineage"), dict):
            continue
        lineage = record["lineage"]
        turn, parents, conversation = lineage.get("turn"), lineage.get("parent_cells"), lineage.get("conversation")
        if isinstance(turn, bool) or not isinstance(turn, int) or not isinstance(parents, list) \
                or len(parents) != turn or not isinstance(conversation, str) or not conversation:
            continue
        if not all(p is None or isinstance(p, str) for p in parents):
            continue
        started = record.get("started_at")
        when = float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else 0.0
        if best is None or when >= best["_when"]:
            best = {"conversation": conversation, "parents": parents, "cell": record.get("cell_id"), "_when": when}
    if best is None:
        return None
    cell = best["cell"]
    return Chat(name, best["conversation"], [*best["parents"], cell if isinstance(cell, str) else None])
