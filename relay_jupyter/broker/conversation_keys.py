"""Conversations belong to an origin: the broker's key of a client's conversation name.

A kernel names its chat ``default``; every notebook does. The store, the runtime and the scratch
workspace use ``conversation_key(origin, name)``, so one notebook can never reach another's history or
workspace by naming the same conversation.
"""

from __future__ import annotations

__all__ = ["conversation_key"]


def conversation_key(origin: str, conversation: str) -> str:
    """The broker's id of the conversation ``conversation`` of ``origin`` (store, runtime, workspace)."""
    return f"{origin}|{conversation}"
