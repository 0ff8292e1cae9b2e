"""Which broker conversation a ``%%agent`` cell continues, and when re-running a cell forks it.

One conversation per notebook by default (chat ``default``), or named with ``--chat NAME``. Each
chat remembers the cell id of every turn it took. Re-running a cell that already took turn ``k``
forks the conversation there (``conversations.fork {conversation, at_turn: k}``): that turn and
everything after it are replaced -- the notebook's "undo" (seed 003: prefix kept, suffix changed ->
fork at the rollback point). ``--new`` starts a fresh conversation under the same chat name.

Turn bookkeeping lives in the kernel: after a kernel restart the next cell simply continues.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

__all__ = ["Chat", "ConversationBook", "valid_chat_name"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


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

    def __init__(self) -> None:
        self.chats: dict[str, Chat] = {}

    def chat(self, name: str, *, new: bool = False) -> Chat:
        """The chat to use; ``new`` replaces it with a fresh conversation."""
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
