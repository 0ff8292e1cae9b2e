"""The model's ``tool_use`` id of an engine's MCP call, linked to the gateway's call (issue 17).

The claude-code engine's CLI makes an ``mcp__relay__<tool>`` call in two steps: its ``PreToolUse`` hook tells
the engine the model proposed ``<tool>`` with these arguments under ``tool_use_id``, then the CLI sends the
``tools/call`` to relay's MCP gateway. The gateway runs the call through the one executor; with this link it
journals and audits it under the model's own ``tool_use_id`` (as the engine's built-in calls are), so crash
repair's "outcome unknown" and the audit name the call the model proposed.

How a gateway call is matched (:meth:`ProposedCalls.claim`): the CLI sends the id in the call's
``_meta["claudecode/toolUseId"]`` (Claude Code does); it is taken only when the hook announced that id for the
same tool with the same arguments. Without ``_meta``, the oldest announced call with the same tool and arguments
is taken. An id is taken at most once; a call nothing announced (a process of the run that read the token
and called the gateway itself) keeps a fresh ``mcpgw_`` id — it is gated the same either way: the link only
names the call, it never allows anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

__all__ = ["META_KEY", "ProposedCalls"]

#: Where Claude Code puts the model's tool_use id in an MCP ``tools/call`` request.
META_KEY = "claudecode/toolUseId"
_ID = re.compile(r"[A-Za-z0-9_\-]{1,128}")
_MAX_OPEN = 256  # a run announces a call just before it makes it: a short queue is plenty


def _digest(arguments: Any) -> str:
    try:
        body = json.dumps(arguments if arguments is not None else {}, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return ""
    return hashlib.sha256(body.encode()).hexdigest()


class ProposedCalls:
    """The MCP calls a run's model proposed that the gateway has not seen yet, by ``tool_use_id``."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._taken: set[str] = set()

    def expect(self, tool_use_id: Any, tool: str, arguments: Any) -> bool:
        """The hook saw ``tool`` (relay's name) proposed under ``tool_use_id``; False when the id is not one
        relay takes (shape, already taken)."""
        if not isinstance(tool_use_id, str) or not _ID.fullmatch(tool_use_id) or tool_use_id in self._taken:
            return False
        digest = _digest(arguments)
        if not digest:
            return False
        self._open[tool_use_id] = (tool, digest)
        self._open.move_to_end(tool_use_id)
        while len(self._open) > _MAX_OPEN:
            self._open.popitem(last=False)
        return True

    def claim(self, tool: str, arguments: Any, meta: Any) -> str | None:
        """The ``tool_use_id`` of the gateway call of ``tool`` with ``arguments`` (its ``_meta`` as sent), or
        None when no announced call matches."""
        wanted = (tool, _digest(arguments))
        named = meta.get(META_KEY) if isinstance(meta, dict) else None
        if named is not None:
            found = named if isinstance(named, str) and self._open.get(named) == wanted else None
        else:
            found = next((tid for tid, entry in self._open.items() if entry == wanted), None)
        if found is not None:
            del self._open[found]
            self._taken.add(found)
        return found

    def __len__(self) -> int:
        return len(self._open)
