"""The script of a fake model server: what it answers, in what order, at what pace.

Shared by :mod:`relay_jupyter.testing.fake_anthropic` and :mod:`relay_jupyter.testing.fake_openai`, so a
test writes its replies once and can point either fake at them::

    fake.enqueue(Reply(text("Let me look."), tool_use("echo", {"text": "hi"})))
    fake.enqueue("plain text is a one-block reply")
    fake.enqueue_error(status=429, retry_after=0.05)

Token counts are approximated by words (``\\S+\\s*`` pieces) so they are deterministic; every number can
be overridden with :class:`Usage`.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_TEXT",
    "Block",
    "ErrorReply",
    "Reply",
    "Script",
    "TextBlock",
    "ThinkingBlock",
    "ToolUseBlock",
    "Usage",
    "count_tokens",
    "split_json",
    "split_text",
    "text",
    "thinking",
    "tool_use",
]

DEFAULT_TEXT = "(fake) no scripted reply"

StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"]

_TOKEN = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class TextBlock:
    """A text content block."""

    text: str


@dataclass(frozen=True)
class ToolUseBlock:
    """A tool call: ``name`` with the JSON object ``input``; ``id`` is generated when not given."""

    name: str
    input: dict[str, Any]
    id: str


@dataclass(frozen=True)
class ThinkingBlock:
    """Extended thinking: the Anthropic fake streams it as ``thinking_delta`` + ``signature_delta``;
    the OpenAI fake as ``reasoning_content`` (the vLLM / DeepSeek convention)."""

    thinking: str
    signature: str


Block = TextBlock | ToolUseBlock | ThinkingBlock
_BLOCK_TYPES = (TextBlock, ToolUseBlock, ThinkingBlock)


def text(value: str) -> TextBlock:
    """A text block for a :class:`Reply`."""
    if not isinstance(value, str):
        raise TypeError(f"text() takes a str, got {type(value).__name__}")
    return TextBlock(value)


def thinking(value: str, signature: str | None = None) -> ThinkingBlock:
    """A thinking block for a :class:`Reply`; ``signature`` defaults to a fresh opaque string (clients
    must send it back unchanged)."""
    if not isinstance(value, str):
        raise TypeError(f"thinking() takes a str, got {type(value).__name__}")
    return ThinkingBlock(value, signature or f"sigfake{secrets.token_hex(16)}")


def tool_use(name: str, input: dict[str, Any] | None = None, id: str | None = None) -> ToolUseBlock:
    """A tool_use block for a :class:`Reply`; ``id`` defaults to a fresh ``toolu_...`` id.

    Raises:
        TypeError: ``input`` is not a JSON-serialisable dict.
    """
    payload = {} if input is None else input
    if not isinstance(payload, dict):
        raise TypeError("tool_use() input must be a dict (the API sends a JSON object)")
    json.dumps(payload)  # fail here, at scripting time, rather than inside the server thread
    return ToolUseBlock(name=name, input=payload, id=id or f"toolu_fake{secrets.token_hex(8)}")


@dataclass(frozen=True)
class Usage:
    """Token usage of one reply. Fields left ``None`` are computed (words in the request / reply)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


@dataclass(frozen=True)
class Reply:
    """One scripted model reply.

    ``Reply(text("hi"), tool_use("echo", {"text": "x"}))`` or ``Reply([text("hi"), ...])``; a plain
    ``str`` becomes a text block.

    Args:
        blocks: the content blocks, in order.
        stop_reason: defaults to ``tool_use`` when a tool_use block is present, else ``end_turn``.
        usage: overrides the computed token counts.
        error_after: when set, the stream emits an ``error`` event after this many content deltas
            (0 = right after ``message_start``) and ends; a non-streaming request gets HTTP 529 instead.
        error_type: the API error type of that event.
        drop_after: when set, the connection is cut (TCP reset, no error event, no end of stream)
            after this many content deltas: a network failure. Non-streaming: cut before answering.
        first_token_delay: seconds to wait before the first content delta.
        tokens_per_second: pace of the deltas after the first (``None`` = as fast as possible).
        chunk_tokens: how many word-tokens one text delta carries.
        model: the model name to report (defaults to the requested model).
    """

    blocks: tuple[Block, ...] = ()
    stop_reason: StopReason | None = None
    usage: Usage | None = None
    error_after: int | None = None
    drop_after: int | None = None
    error_type: str = "overloaded_error"
    first_token_delay: float = 0.0
    tokens_per_second: float | None = None
    chunk_tokens: int = 3
    model: str | None = None

    def __init__(self, *blocks: Block | str | list[Block | str], **options: Any) -> None:
        # Reply(text("a"), tool_use(...)) and Reply([text("a"), tool_use(...)]) are both accepted
        flat = [b for arg in blocks for b in (arg if isinstance(arg, (list, tuple)) else (arg,))]
        converted = tuple(TextBlock(b) if isinstance(b, str) else b for b in flat)
        for b in converted:
            if not isinstance(b, _BLOCK_TYPES):
                raise TypeError(f"Reply() takes text()/tool_use()/thinking() blocks or str, "
                                f"got {type(b).__name__}")
        object.__setattr__(self, "blocks", converted)
        for name in (
            "stop_reason", "usage", "error_after", "drop_after", "error_type", "first_token_delay",
            "tokens_per_second", "chunk_tokens", "model",
        ):
            object.__setattr__(self, name, options.pop(name, getattr(type(self), name)))
        if options:
            raise TypeError(f"Reply() got unknown options: {', '.join(sorted(options))}")
        if self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        if self.tokens_per_second is not None and self.tokens_per_second <= 0:
            raise ValueError("tokens_per_second must be > 0")

    @property
    def final_stop_reason(self) -> StopReason:
        """The stop reason sent: the scripted one, or derived from the blocks."""
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolUseBlock) for b in self.blocks) else "end_turn"

    def output_tokens(self) -> int:
        """Word-approximated output tokens (at least 1, as the real API never reports 0)."""
        if self.usage is not None and self.usage.output_tokens is not None:
            return self.usage.output_tokens
        n = 0
        for b in self.blocks:
            if isinstance(b, TextBlock):
                n += count_tokens(b.text)
            elif isinstance(b, ThinkingBlock):
                n += count_tokens(b.thinking)
            else:
                n += count_tokens(json.dumps(b.input)) + 1
        return max(n, 1)


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error answer: ``status`` with the API's error JSON, or ``body`` verbatim when given."""

    status: int = 429
    retry_after: float | None = None
    body: Any = None
    message: str | None = None
    error_type: str | None = None


def count_tokens(value: str) -> int:
    """Deterministic token estimate: the number of whitespace-separated words."""
    return len(value.split())


def split_text(value: str, chunk_tokens: int = 3) -> list[str]:
    """Split text into delta chunks of ``chunk_tokens`` words; always >= 2 chunks for 2+ characters,
    so clients that only handle a single delta are caught."""
    pieces = _TOKEN.findall(value)
    chunks = ["".join(pieces[i : i + chunk_tokens]) for i in range(0, len(pieces), chunk_tokens)]
    if len(chunks) == 1 and len(value) > 1:
        half = len(value) // 2
        chunks = [value[:half], value[half:]]
    return chunks or [""]


def split_json(value: dict[str, Any]) -> list[str]:
    """Serialise ``value`` and split it where a naive client breaks: an empty first piece (as the real
    API sends), between a key and its colon, between a backslash and the escaped character, inside a
    ``\\uXXXX`` escape, and every few characters inside strings. ``"".join(result)`` is the JSON."""
    doc = json.dumps(value, ensure_ascii=True)
    cuts: set[int] = set()
    in_string = False
    run = 0
    i = 0
    while i < len(doc):
        ch = doc[i]
        if in_string:
            if ch == "\\":
                cuts.add(i + 1)  # between the backslash and what it escapes
                if doc[i + 1] == "u":
                    cuts.add(i + 4)  # inside \\uXXXX
                    i += 6
                else:
                    i += 2
                continue
            if ch == '"':
                in_string = False
                if doc[i + 1 : i + 2] == ":":
                    cuts.add(i + 1)  # between a key and its colon
            else:
                run += 1
                if run % 5 == 0:
                    cuts.add(i)  # mid-string
        elif ch == '"':
            in_string = True
        i += 1
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(doc)), len(doc)]
    return [""] + [doc[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass
class Script:
    """A thread-safe queue of replies; the fake's loop thread pops, the test thread pushes."""

    default: Reply = field(default_factory=lambda: Reply(DEFAULT_TEXT))
    _queue: collections.deque[Reply | ErrorReply] = field(default_factory=collections.deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, item: Reply | ErrorReply | Block | str | list[Block | str]) -> None:
        """Append one reply (a str, a block or a list of blocks is wrapped in a :class:`Reply`)."""
        if isinstance(item, (str, *_BLOCK_TYPES)):
            item = Reply(item)
        elif isinstance(item, list):
            item = Reply(*item)
        if not isinstance(item, (Reply, ErrorReply)):
            raise TypeError(f"cannot enqueue {type(item).__name__}; use Reply(...), text(...), or a str")
        with self._lock:
            self._queue.append(item)

    def pop(self) -> Reply | ErrorReply:
        """The next scripted reply, or :attr:`default` when the queue is empty."""
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    def pending(self) -> int:
        """How many scripted replies have not been served yet."""
        with self._lock:
            return len(self._queue)

    def clear(self) -> None:
        """Drop every scripted reply not yet served."""
        with self._lock:
            self._queue.clear()
