"""What both fake model servers share: the reply queue API, request-word counting, and pacing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .loopback import LoopbackServer
from .script import DEFAULT_TEXT, Block, ErrorReply, Reply, Script, count_tokens

__all__ = ["Pacer", "ScriptedServer", "count_request_tokens"]

# Fields that carry structure, not text: not counted as request words.
_STRUCTURAL = frozenset({"role", "type", "id", "tool_use_id", "tool_call_id", "cache_control"})


def _strings(value: Any) -> list[str]:
    """Every string inside a JSON value except keys and structural fields (role, type, ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k not in _STRUCTURAL for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def count_request_tokens(body: dict[str, Any]) -> int:
    """Deterministic input-token estimate: words in ``system``, ``messages`` and ``tools``."""
    words = sum(count_tokens(s) for key in ("system", "messages", "tools") for s in _strings(body.get(key)))
    return max(words, 1)


class ScriptedServer(LoopbackServer):
    """A loopback server answering from a :class:`~relay_jupyter.testing.script.Script`."""

    def __init__(self, api_key: str | None = None, default: Reply | str | None = None,
                 max_body_bytes: int = 32 * 1024 * 1024) -> None:
        super().__init__(api_key=api_key, max_body_bytes=max_body_bytes)
        if isinstance(default, str):
            default = Reply(default)
        self.script = Script(default=default or Reply(DEFAULT_TEXT))

    def enqueue(self, *replies: Reply | Block | str | list[Block | str]):
        """Queue replies, served in order, one per model request. A str, a block or a list of blocks
        becomes one :class:`Reply`. Returns self, so calls chain."""
        for reply in replies:
            self.script.push(reply)
        return self

    def enqueue_error(self, status: int = 429, retry_after: float | None = None, body: Any = None,
                      message: str | None = None, error_type: str | None = None):
        """Queue an HTTP error answer: the API's error JSON (or ``body`` verbatim), with
        ``retry-after`` (whole seconds, rounded up) and ``retry-after-ms`` headers when ``retry_after``
        (seconds) is given. Returns self."""
        self.script.push(ErrorReply(status, retry_after, body, message, error_type))
        return self

    @property
    def pending(self) -> int:
        """Scripted replies not yet served."""
        return self.script.pending()

    @staticmethod
    def retry_headers(item: ErrorReply) -> dict[str, str]:
        """``retry-after`` / ``retry-after-ms`` for a scripted error."""
        if item.retry_after is None:
            return {}
        return {"retry-after": str(max(1, -int(-item.retry_after // 1))),
                "retry-after-ms": str(int(item.retry_after * 1000))}


class Pacer:
    """Sleeps so deltas leave at ``tokens_per_second`` after ``first_delay``, against a fixed schedule
    (sleeping a fixed amount per delta would drift by the time spent writing)."""

    def __init__(self, first_delay: float, tokens_per_second: float | None) -> None:
        self.first_delay = first_delay
        self.rate = tokens_per_second
        self.t0: float | None = None
        self.sent = 0.0

    async def wait(self, tokens: int) -> None:
        """Wait until the delta carrying ``tokens`` is due."""
        if self.t0 is None:
            if self.first_delay > 0:
                await asyncio.sleep(self.first_delay)
            self.t0 = time.monotonic()
        elif self.rate is not None:
            # this delta is due once every token before it has had its share of time
            delay = self.t0 + self.sent / self.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        self.sent += tokens
