"""The broker's memory of endpoint sessions (issue 16 item 4): per ``(origin, session)``, the message
digests of the last request that *succeeded* upstream, so the next request's lineage can be classified
(core/lineage.py holds the pure rules; this module owns the only mutable state).

    seen = broker.sessions.observe(origin, headers, body)   # before forwarding: nothing is stored
    ...forward...
    if upstream_succeeded:
        seen.commit()                                       # only now the new state is kept

Bounded: at most :data:`MAX_SESSIONS` sessions (least recently used forgotten first) and
:data:`MAX_MESSAGES` digests per session (a longer history keeps its first ones: a continuation of it is
still recognised, an undo past the bound is reported as ``continuation`` of the kept part). Digests only,
16 bytes a message: never text. Process memory: a restarted broker starts every session as ``new``.
Sessions are per origin: two notebooks naming the same session id never see each other's history.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.lineage import Lineage, classify, message_digests, resolve_session

__all__ = ["MAX_MESSAGES", "MAX_SESSIONS", "Observation", "SessionBook"]

MAX_SESSIONS = 1024
MAX_MESSAGES = 4096


@dataclass
class Observation:
    """One request's session and lineage; :meth:`commit` stores its history (call it only after the
    upstream request succeeded; a second call does nothing)."""

    session: str
    how: str
    lineage: Lineage
    _book: SessionBook | None = field(default=None, repr=False)
    _key: tuple[str, str] | None = field(default=None, repr=False)
    _digests: tuple[bytes, ...] = field(default=(), repr=False)

    def commit(self) -> None:
        book, self._book = self._book, None
        if book is not None and self._key is not None:
            book._store(self._key, self._digests)


class SessionBook:
    """The LRU of session histories (thread-safe)."""

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, max_messages: int = MAX_MESSAGES) -> None:
        self._lock = threading.Lock()
        self._max_sessions = max_sessions
        self._max_messages = max_messages
        self._histories: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        """(origin, session) -> the stored digests, concatenated (16 bytes each: no per-object overhead)."""

    def __len__(self) -> int:
        return len(self._histories)

    def stored(self, origin: str, session: str) -> tuple[bytes, ...] | None:
        with self._lock:
            raw = self._histories.get((origin, session))
        if raw is None:
            return None
        return tuple(raw[i:i + 16] for i in range(0, len(raw), 16))

    def observe(self, origin: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> Observation:
        """Resolve the session of a Messages API request body and classify it. Stores nothing."""
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        session, how = resolve_session(headers, body.get("system"), messages)
        digests = message_digests(messages[: self._max_messages])
        stored = self.stored(origin, session)
        lineage = classify(stored, digests)
        return Observation(session, how, lineage, self, (origin, session), digests)

    def _store(self, key: tuple[str, str], digests: Sequence[bytes]) -> None:
        raw = b"".join(digests[: self._max_messages])
        with self._lock:
            self._histories[key] = raw
            self._histories.move_to_end(key)
            while len(self._histories) > self._max_sessions:
                self._histories.popitem(last=False)
