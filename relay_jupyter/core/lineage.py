"""Sessions and lineage of Messages API requests (issue 16 item 4; the seed's proxy design). Pure: no
I/O, no state, no clock — only hashing and comparison, testable without mocks.

A **session** groups the requests of one conversation: the client's own header when it sends one
(``x-relay-session``, or Claude Code's ``X-Claude-Code-Session-Id``), else a fingerprint of the system
prompt and the first user message (a conversation keeps both while it goes on). A session id is a
short identifier or a hash (:func:`~relay_jupyter.core.telemetry.session_id_for`): never free text.

**Lineage** says how a request's ``messages`` relate to those of the session's last *successful*
request (the caller stores the new state only after the upstream request succeeded):

==============  ======================================================================================
``new``         the session has no stored state (its first request, or one the broker forgot)
``continuation`` the stored messages are a prefix of the new ones (the usual next turn, or a retry)
``undo``        the first ``k`` stored messages are kept (``1 <= k <`` stored count) and what followed
                was dropped or replaced: the client rolled back to message ``k`` (an edited history)
``compaction``  the beginning changed but the stored history's last messages are still there, in order
                (at least :data:`MIN_COMPACTION_SUFFIX` of them, or all of a shorter history): the
                client summarised its early history
``diverged``    no overlap the other rules can prove: a different conversation under the same id
==============  ======================================================================================

Messages are compared by the SHA-256 of a canonical form (:func:`message_digest`): ``content`` as a
list of blocks (a string is one text block), ``cache_control`` markers dropped (clients move them from
turn to turn), keys sorted. The digests are what a caller stores: never the text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .telemetry import LineageKind, session_id_for

__all__ = [
    "DIGEST_BYTES",
    "MIN_COMPACTION_SUFFIX",
    "SESSION_HEADERS",
    "Lineage",
    "classify",
    "fingerprint",
    "message_digest",
    "message_digests",
    "resolve_session",
    "session_from_headers",
]

#: Request headers that name a session, first match wins (lower case).
SESSION_HEADERS: tuple[str, ...] = ("x-relay-session", "x-claude-code-session-id")
#: Bytes kept of each message's SHA-256 (128 bits: collisions are not a practical concern).
DIGEST_BYTES = 16
#: How many of the stored history's last messages a compaction must keep (fewer: a history that short).
MIN_COMPACTION_SUFFIX = 2
_MAX_HEADER = 1024
_DROPPED_KEYS = frozenset({"cache_control"})


def _normal(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items() if k not in _DROPPED_KEYS}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str).encode("utf-8", "surrogatepass")


def _blocks(content: Any) -> Any:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _normal(content)


def message_digest(message: Any) -> bytes:
    """The digest of one message: its role and content in canonical form (other fields ignored)."""
    if isinstance(message, Mapping):
        form: Any = {"role": message.get("role"), "content": _blocks(message.get("content"))}
    else:
        form = {"role": None, "content": _normal(message)}
    return hashlib.sha256(_canonical(form)).digest()[:DIGEST_BYTES]


def message_digests(messages: Sequence[Any]) -> tuple[bytes, ...]:
    """:func:`message_digest` of each message, in order."""
    return tuple(message_digest(m) for m in messages)


def session_from_headers(headers: Mapping[str, str]) -> str | None:
    """The session a client names in its headers (:data:`SESSION_HEADERS`), as a safe id, or None.
    Header names are matched without regard to case; an empty or oversized value is ignored."""
    lowered = {str(k).lower(): v for k, v in headers.items()} if not hasattr(headers, "get_list") else None
    for name in SESSION_HEADERS:
        value = headers.get(name) if lowered is None else lowered.get(name)
        if isinstance(value, str):
            value = value.strip()
            if value and len(value) <= _MAX_HEADER:
                return session_id_for(value)
    return None


def fingerprint(system: Any, messages: Sequence[Any]) -> str:
    """``fp:`` + a hash of the system prompt and the first user message (what stays the same while a
    conversation goes on). A string system prompt and the same text as one block hash alike."""
    first = next((m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"), None)
    sys_form = _blocks(system) if system not in (None, "", []) else []
    first_form = _blocks(first.get("content")) if first is not None else None
    digest = hashlib.sha256(_canonical({"system": sys_form, "first_user": first_form})).hexdigest()
    return "fp:" + digest[:32]


def resolve_session(headers: Mapping[str, str], system: Any, messages: Sequence[Any]) -> tuple[str, str]:
    """``(session id, how)``: ``how`` is ``header`` or ``fingerprint``."""
    named = session_from_headers(headers)
    if named is not None:
        return named, "header"
    return fingerprint(system, messages), "fingerprint"


@dataclass(frozen=True, slots=True)
class Lineage:
    """How a request relates to its session's stored history.

    ``kept``: how many stored messages the request keeps at its start (continuation: all of them;
    undo: the rollback point; else 0). ``resume_at``: for a compaction, the index in the request just
    after the stored suffix it kept (what is new from there on); else ``kept``.
    """

    kind: LineageKind
    kept: int = 0
    resume_at: int = 0


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _kept_suffix(stored: Sequence[bytes], incoming: Sequence[bytes]) -> tuple[int, int]:
    """``(k, end)``: the longest suffix of ``stored`` (length ``k``) found contiguously in ``incoming``,
    ending just before ``incoming[end]`` (the latest such place on a tie); ``(0, 0)`` when none."""
    last = stored[-1]
    best, best_end = 0, 0
    for q in range(len(incoming) - 1, -1, -1):
        if incoming[q] != last:
            continue
        k = 1
        while k < len(stored) and k <= q and incoming[q - k] == stored[-1 - k]:
            k += 1
        if k > best:
            best, best_end = k, q + 1
            if k == len(stored):
                break
    return best, best_end


def classify(stored: Sequence[bytes] | None, incoming: Sequence[bytes]) -> Lineage:
    """The lineage of a request with message digests ``incoming`` against the session's ``stored``
    digests (None or empty: nothing stored). Total and deterministic: every input gets one kind."""
    if not stored:
        return Lineage("new")
    n = len(stored)
    j = _common_prefix(stored, incoming)
    if j == n:
        return Lineage("continuation", kept=n, resume_at=n)
    if j >= 1:
        return Lineage("undo", kept=j, resume_at=j)
    k, end = _kept_suffix(stored, incoming)
    if k >= min(MIN_COMPACTION_SUFFIX, n):
        return Lineage("compaction", kept=0, resume_at=end)
    return Lineage("diverged")
