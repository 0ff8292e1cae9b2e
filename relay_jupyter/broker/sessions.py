"""The broker's memory of endpoint sessions (issue 16 item 4): per ``(origin, session)``, the message
digests of the last request that *succeeded* upstream, so the next request's lineage can be classified
(core/lineage.py holds the pure rules; this module owns the only mutable state).

    seen = await broker.sessions.observe_async(origin, headers, body)   # before forwarding: nothing is stored
    ...forward...
    if upstream_succeeded:
        seen.commit()                                                   # only now the new state is kept

Durable: with a store (the broker's), each committed history is also written to it, so a restarted broker,
or a second broker on the same store (two daemons on one PostgreSQL ``store_url``, a daemon and a Jupyter
server on one data dir), classifies the next request of the session against it. No schema of its own: one
row of the ``conversations`` table per session, id ``lineage:<sha256 of origin and session>`` (never a
conversation key: those are JSON arrays, ``conversation_keys.py``), the session's origin as its origin, no
messages, and the digests in its ``meta`` (``{"kind": "endpoint-session", "session", "digests"}``, base64).
``conversations.list`` leaves these rows out (:func:`is_session_row`).

The store's reads and writes run on one thread of their own, in order (a commit is queued, so the
synchronous caller in ``model_proxy._record`` never waits for the disk, and a later read of the same
session sees it). Lineage is telemetry, never enforcement: a store that is slow (over
:data:`STORE_WAIT` seconds) or failing never delays or fails a request — the broker's memory answers
then, as before.

Bounded: at most :data:`MAX_SESSIONS` sessions in memory (least recently used forgotten first) and
:data:`MAX_MESSAGES` digests per session (a longer history keeps its first ones: a continuation of it is
still recognised, an undo past the bound is reported as ``continuation`` of the kept part). Digests only,
16 bytes a message: never text. Sessions are per origin: two notebooks naming the same session id never
see each other's history.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..core.lineage import DIGEST_BYTES, Lineage, classify, message_digests, resolve_session

__all__ = ["MAX_MESSAGES", "MAX_SESSIONS", "ROW_PREFIX", "STORE_WAIT", "Observation", "SessionBook",
           "is_session_row", "row_id"]

log = logging.getLogger(__name__)

MAX_SESSIONS = 1024
MAX_MESSAGES = 4096
#: Seconds a request waits for its session's stored history before the broker's memory answers instead.
STORE_WAIT = 2.0
#: The ``conversations`` row id prefix of a stored session history.
ROW_PREFIX = "lineage:"
_KIND = "endpoint-session"


def row_id(origin: str, session: str) -> str:
    """The ``conversations`` row id of ``(origin, session)``'s history (fixed length: a session id may be long)."""
    key = json.dumps([origin, session], ensure_ascii=True, separators=(",", ":"))
    return ROW_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def is_session_row(row: Mapping[str, Any]) -> bool:
    """Whether a ``conversations`` row (``list_conversations``' summary) is a stored session history, not a chat."""
    return str(row.get("conv_id") or "").startswith(ROW_PREFIX)


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
    """The LRU of session histories (thread-safe), written through to ``store`` when given (a store with
    ``load_conversation`` / ``save_conversation``: the broker's)."""

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, max_messages: int = MAX_MESSAGES,
                 store: Any = None) -> None:
        self._lock = threading.Lock()
        self._max_sessions = max_sessions
        self._max_messages = max_messages
        self._histories: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        """(origin, session) -> the stored digests, concatenated (16 bytes each: no per-object overhead)."""
        self._backing = store
        # one thread, so a session's writes land in commit order and a read queued after a write sees it
        # (the store's own pool, runtime/offload.py, runs calls in any order)
        self._io: ThreadPoolExecutor | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._histories)

    # -- memory ------------------------------------------------------------------------------------

    def stored(self, origin: str, session: str) -> tuple[bytes, ...] | None:
        with self._lock:
            raw = self._histories.get((origin, session))
        return None if raw is None else _split(raw)

    def _remember(self, key: tuple[str, str], raw: bytes) -> None:
        with self._lock:
            self._histories[key] = raw
            self._histories.move_to_end(key)
            while len(self._histories) > self._max_sessions:
                self._histories.popitem(last=False)

    # -- classification ----------------------------------------------------------------------------

    def _resolve(self, origin: str, headers: Mapping[str, str], body: Mapping[str, Any]
                 ) -> tuple[str, str, tuple[bytes, ...]]:
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        session, how = resolve_session(headers, body.get("system"), messages)
        return session, how, message_digests(messages[: self._max_messages])

    def _observation(self, origin: str, session: str, how: str, digests: tuple[bytes, ...],
                     stored: tuple[bytes, ...] | None) -> Observation:
        return Observation(session, how, classify(stored, digests), self, (origin, session), digests)

    def observe(self, origin: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> Observation:
        """Resolve the session of a Messages API request body and classify it against the broker's memory
        (no store read: :meth:`observe_async` reads the store). Stores nothing."""
        session, how, digests = self._resolve(origin, headers, body)
        return self._observation(origin, session, how, digests, self.stored(origin, session))

    async def observe_async(self, origin: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> Observation:
        """:meth:`observe`, against the store's history of the session when there is a store (read on the
        session thread, at most :data:`STORE_WAIT` seconds; else, or on a failure, the broker's memory)."""
        session, how, digests = self._resolve(origin, headers, body)
        stored = self.stored(origin, session)
        if self._backing is not None and not self._closed:
            try:
                found = await asyncio.wait_for(asyncio.wrap_future(self._submit(self._load, origin, session)),
                                               STORE_WAIT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a slow or failing store never stops the request
                log.warning("relay: reading an endpoint session's history failed (%s); the broker's memory "
                            "classifies this request", type(exc).__name__)
            else:
                if found is not None:
                    stored = found
        return self._observation(origin, session, how, digests, stored)

    # -- the store ---------------------------------------------------------------------------------

    def _submit(self, fn: Any, *args: Any) -> Future[Any]:
        with self._lock:
            if self._io is None:
                self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-sessions")
            return self._io.submit(fn, *args)

    def _load(self, origin: str, session: str) -> tuple[bytes, ...] | None:
        row = self._backing.load_conversation(row_id(origin, session))
        if row is None or row.get("origin") != origin:
            return None
        meta = row.get("meta") or {}
        if meta.get("kind") != _KIND or meta.get("session") != session:
            return None
        try:
            raw = base64.b64decode(str(meta.get("digests", "")), validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) % DIGEST_BYTES:
            return None
        raw = raw[: self._max_messages * DIGEST_BYTES]
        self._remember((origin, session), raw)
        return _split(raw)

    def _save(self, origin: str, session: str, raw: bytes) -> None:
        try:
            self._backing.save_conversation(row_id(origin, session), origin, "", [], {
                "kind": _KIND, "session": session, "digests": base64.b64encode(raw).decode("ascii")})
        except Exception as exc:  # noqa: BLE001 - the broker's memory still has it; telemetry never fails a request
            log.warning("relay: storing an endpoint session's history failed: %s", type(exc).__name__)

    def _store(self, key: tuple[str, str], digests: Sequence[bytes]) -> None:
        raw = b"".join(digests[: self._max_messages])
        self._remember(key, raw)
        if self._backing is not None and not self._closed:
            self._submit(self._save, key[0], key[1], raw)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued store write has landed (tests; :meth:`close`)."""
        if self._io is not None:
            self._submit(lambda: None).result(timeout)

    def close(self) -> None:
        """Write what is queued, then stop the session thread (before the broker closes its store)."""
        self._closed = True
        with self._lock:
            io, self._io = self._io, None
        if io is not None:
            io.shutdown(wait=True)


def _split(raw: bytes) -> tuple[bytes, ...]:
    return tuple(raw[i:i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))
