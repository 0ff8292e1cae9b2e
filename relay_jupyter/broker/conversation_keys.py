"""Conversations belong to an origin: the broker's key of a client's conversation name.

A kernel names its chat ``default``; every notebook does. The key of a conversation is the *pair*
``(origin, name)``, two separate values. Where one text id is needed (the store's primary key, the
runtime's run index, the scratch workspace's directory) it is :func:`conversation_key`: the
canonical JSON of the pair (``["notebook:a.ipynb","default"]``). JSON escapes its quotes, so no
choice of origin or name can make two pairs share an id (a joined string ``origin|name`` could:
``("notebook:a|b", "c")`` and ``("notebook:a", "b|c")``), and :func:`split_conversation_key` gets
both values back exactly. A workspace directory is a hash of that id (``workspace.scratch``).

Names are validated by one pattern in every params model (``protocol.models_runs.ConversationName``);
origins are built by the broker, never sent by a kernel.

Stores written before this scheme used ``f"{origin}|{name}"``; :func:`migrate_legacy_keys` rewrites
their conversations and workspaces to the new ids once, at start (the origin column of each row
tells exactly where the name begins).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from ..core.ports import ConversationStore

__all__ = ["conversation_key", "split_conversation_key", "conversation_name", "legacy_key",
           "migrate_legacy_keys"]

log = logging.getLogger("relay_jupyter.broker")


def conversation_key(origin: str, conversation: str) -> str:
    """The broker's id of the conversation ``conversation`` of ``origin`` (store, runtime, workspace)."""
    if not isinstance(origin, str) or not isinstance(conversation, str):
        raise TypeError("origin and conversation must be strings")
    # ASCII-only: a notebook path with a lone surrogate (an undecodable file name) still gives a key that
    # SQLite and the file system accept
    return json.dumps([origin, conversation], ensure_ascii=True, separators=(",", ":"))


def split_conversation_key(key: str) -> tuple[str, str] | None:
    """``(origin, name)`` of a key made by :func:`conversation_key`; None for anything else."""
    if not isinstance(key, str) or not key.startswith("["):
        return None
    try:
        value = json.loads(key)
    except ValueError:
        return None
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)
            and conversation_key(value[0], value[1]) == key):
        return value[0], value[1]
    return None


def conversation_name(key: str, origin: str | None = None) -> str:
    """The client's name of a stored conversation id (the id itself when it is not a pair key).

    A legacy ``origin|name`` id of ``origin`` is shown by its name as well."""
    pair = split_conversation_key(key)
    if pair is not None:
        return pair[1]
    if origin is not None and isinstance(key, str) and key.startswith(f"{origin}|"):
        return key[len(origin) + 1:]
    return key


def legacy_key(origin: str, conversation: str) -> str:
    """The id stores written before the pair keys used (read only by the migration)."""
    return f"{origin}|{conversation}"


def _ws_dir(base: Path, key: str) -> Path:
    # the same derivation as workspace.scratch.WorkspaceManager.root_for (kept here so that the
    # migration does not depend on an open manager)
    return base / f"ws-{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


def migrate_legacy_keys(conversations: ConversationStore, workspaces_dir: Path | None = None) -> int:
    """Rewrite conversations stored under ``origin|name`` ids to pair keys (and move their scratch
    workspaces along); returns how many were migrated. Idempotent: a row already keyed by a pair
    is left alone, and a crash between the save and the delete leaves both rows, the next start
    finishes (the new row wins)."""
    moved = 0
    for summary in conversations.list_conversations(None):
        cid, origin = summary.get("conv_id"), summary.get("origin")
        if not isinstance(cid, str) or not isinstance(origin, str) or split_conversation_key(cid) is not None:
            continue
        if not cid.startswith(f"{origin}|"):
            continue
        name = cid[len(origin) + 1:]
        new = conversation_key(origin, name)
        if conversations.conversation_origin(new) is None:
            row = conversations.load_conversation(cid)
            if row is None:
                continue
            conversations.save_conversation(new, origin, row.get("name", ""), list(row.get("messages") or []),
                                            dict(row.get("meta") or {}))
        conversations.delete_conversation(cid)
        if workspaces_dir is not None:
            old_dir, new_dir = _ws_dir(workspaces_dir, cid), _ws_dir(workspaces_dir, new)
            if os.path.lexists(old_dir) and not os.path.lexists(new_dir):
                os.rename(old_dir, new_dir)
        moved += 1
    if moved:
        log.info("relay: %d conversation(s) moved from 'origin|name' ids to (origin, name) keys", moved)
    return moved
