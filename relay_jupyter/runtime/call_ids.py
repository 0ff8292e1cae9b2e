"""Tool-call ids that are unique within a conversation, whatever the backend sends.

The runtime pairs every ``tool_use`` with its ``tool_result`` by id (context pipeline, journal
rows keyed by ``(run_id, call_id)``, crash repair, events). Backends do not all keep ids unique:
llama.cpp and other local OpenAI-compatible servers send ``call_0`` on every turn, some send
none, and a conversation may move from one backend to another. A repeated id made the pipeline
treat the new result as a duplicate of the old one, so the model never saw it and asked again.

:class:`CallIds` is applied where a call is recorded (the turn driver), so everything downstream
— history, journal, events, the gate's audit — sees one id per call. A colliding, empty or
malformed id is replaced by a fresh internal one. No mapping back to the backend's id is kept:
both adapters rebuild the wire pairing (Anthropic ``tool_use``/``tool_result``, OpenAI
``tool_calls``/``tool_call_id``) from our history, where any unique id works.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Iterable
from typing import Any

from ..backends.base import ToolCallDone

__all__ = ["CallIds", "history_ids"]

#: What both APIs accept as a tool-call id (Anthropic's pattern, with its 64-character bound
#: kept loose enough for OpenAI's longer ``call_…`` ids).
_VALID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def history_ids(history: Iterable[dict[str, Any]]) -> set[str]:
    """Every id a stored history already uses, in ``tool_use`` blocks and in ``tool_result`` blocks
    (an orphan result's id counts too: a new call with that id would be paired with it)."""
    ids: set[str] = set()
    for m in history:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for b in content:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_use" and isinstance(b.get("id"), str):
                ids.add(b["id"])
            elif b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str):
                ids.add(b["tool_use_id"])
    return ids


class CallIds:
    """The ids used so far in one conversation; :meth:`claim` hands out a unique one per call."""

    def __init__(self, used: Iterable[str] = ()) -> None:
        self._used = set(used)

    def claim(self, call: ToolCallDone) -> ToolCallDone:
        """``call`` itself when its id is new and well-formed; otherwise a copy with a fresh id."""
        cid = call.id
        if isinstance(cid, str) and cid not in self._used and _VALID.fullmatch(cid):
            self._used.add(cid)
            return call
        fresh = self.fresh()
        return dataclasses.replace(call, id=fresh)

    def fresh(self) -> str:
        """A new id, recorded as used."""
        while True:
            cid = "relay_" + secrets.token_hex(10)
            if cid not in self._used:
                self._used.add(cid)
                return cid
