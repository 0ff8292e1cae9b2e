"""The one protocol every model backend implements, and the normalized message format.

Messages inside relay are Anthropic-like content blocks (the OpenAI adapter converts at its edge)::

    {"role": "user" | "assistant", "content": [block, ...]}
    block = {"type": "text", "text": str}
          | {"type": "tool_use", "id": str, "name": str, "input": dict}
          | {"type": "tool_result", "tool_use_id": str, "content": str, "is_error": bool}

A backend streams one assistant turn as :data:`TurnEvent` values: any number of
:class:`TextDelta`, :class:`ToolCallDone` and :class:`Progress`, then :class:`Usage` (once or more;
the last wins) and exactly one :class:`Stop`. A backend yields :class:`Stop` only when the server sent
its end marker (Anthropic ``message_stop``; OpenAI a ``finish_reason`` or ``[DONE]``): a stream that
ends without it is a :class:`BackendFailure`, never a short answer.

Failures are :class:`BackendFailure`, a refusal whose code says what went wrong:
``BACKEND_UNREACHABLE`` (cannot connect, connection cut), ``BACKEND_TIMEOUT`` (read timeout, turn
deadline) or ``BACKEND_ERROR`` (HTTP error, error event, malformed or oversized stream, truncation).
Messages carry the server's own error type and message with secrets redacted (:func:`redact`), and
end with one sentence saying what the user can do.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from ..core.errors import Code, Refusal
from ..core.types import ToolSpec
from ..core.types import Usage as TokenUsage

__all__ = [
    "MAX_SSE_EVENT",
    "Backend",
    "BackendFailure",
    "Progress",
    "RetryPolicy",
    "Stop",
    "StreamingBackend",
    "TextDelta",
    "ToolCallDone",
    "TurnEvent",
    "UsageEvent",
    "model_allowed",
    "redact",
    "safe_url",
    "tool_schemas",
    "truncated",
]

#: Largest SSE event (bytes up to a blank line, so also the largest line) read from a model server.
#: Counted while the bytes arrive (:mod:`relay_jupyter.backends.capped`), before anything is buffered
#: whole: a flood costs at most this much memory, not the size of the flood.
MAX_SSE_EVENT = 1 << 20


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDone:
    """A complete tool call. ``input`` is the parsed argument object; when the model sent
    arguments that are not a JSON object, ``input`` is ``{}`` and ``raw`` holds what it sent
    (the executor refuses such a call rather than guessing)."""

    id: str
    name: str
    input: dict[str, Any]
    raw: str | None = None
    """The raw argument text when it did not parse as a JSON object; None otherwise."""
    raw_size: int = 0
    """Size in bytes of the argument text as the model sent it (for the 256 KiB cap)."""


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """Token usage of this request so far (cumulative; the last one is the total)."""

    usage: TokenUsage


@dataclass(frozen=True, slots=True)
class Progress:
    """Content arrived that is not yet an event of its own (a piece of a tool call's arguments, a
    thinking delta). It resets the turn's idle deadline; keep-alive pings never produce one."""


@dataclass(frozen=True, slots=True)
class Stop:
    """End of the turn: ``end_turn`` | ``tool_use`` | ``max_tokens`` | ``stop_sequence`` | other."""

    reason: str


TurnEvent = TextDelta | ToolCallDone | UsageEvent | Progress | Stop


class BackendFailure(Refusal):
    """The model endpoint failed (transport, HTTP status, malformed stream, deadline). Never carries a key.

    ``code`` is ``BACKEND_ERROR`` (default), ``BACKEND_UNREACHABLE`` or ``BACKEND_TIMEOUT``;
    ``error_type`` is the server's own error type when it sent one (``overloaded_error`` ...)."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None,
                 retryable: bool = False, code: Code = Code.BACKEND_ERROR,
                 error_type: str | None = None) -> None:
        data: dict[str, Any] = {}
        if status:
            data["status"] = status
        if error_type:
            data["error_type"] = error_type
        super().__init__(code, message, data=data or None)
        self.status = status
        self.retry_after = retry_after
        self.retryable = retryable
        self.error_type = error_type


#: What the user can do, per code: the last sentence of every backend failure message.
ADVICE = {
    Code.BACKEND_UNREACHABLE: "Check that the model server is running and that its URL in the relay "
                              "server config is right, then run the cell again.",
    Code.BACKEND_TIMEOUT: "The model server is slow or stuck: run the cell again, or raise "
                          "c.RelayApp.turn_timeout / turn_idle_timeout if long answers are expected.",
    Code.BACKEND_ERROR: "Run the cell again; if it keeps failing, check the model server's logs or status "
                        "page.",
}


#: Advice for an HTTP error status, when it says more than the code's.
STATUS_ADVICE = {
    401: "Check the API key in the relay server config (its secrets file or the server's environment).",
    403: "Check that the API key may use this model (the account's permissions).",
    404: "Check the model name and the model server's base URL in the relay server config.",
    413: "The request is too large for the model server: start a new conversation or attach less.",
    429: "The model server is rate limiting: wait a minute and run the cell again.",
}


def failure(code: Code, what: str, *, advice: str | None = None, **kw: Any) -> BackendFailure:
    """A :class:`BackendFailure` whose message is ``what`` plus the advice for ``code`` (or ``advice``)."""
    return BackendFailure(f"{what}. {advice or ADVICE[code]}", code=code, **kw)


def truncated(**kw: Any) -> BackendFailure:
    """The stream ended cleanly but without its end marker: the answer is incomplete."""
    return failure(Code.BACKEND_ERROR, "the model server closed the stream before the answer ended", **kw)


# Token-looking strings a server may echo back in an error message (its own or the client's key).
_SECRETISH = re.compile(
    r"(?i)(bearer\s+)[^\s\"',;]+"
    r"|\b(?:sk|pk|rk|ak|key|tok|api)[-_][A-Za-z0-9_\-]{6,}"
    r"|\b[A-Za-z0-9_\-]{32,}\b"
)
_MAX_SERVER_TEXT = 300


def redact(text: Any, secrets: Iterable[str | None] = ()) -> str:
    """A server-provided string made safe to show: one line, at most 300 characters, every
    configured secret and anything token-shaped replaced by ``[redacted]``."""
    line = " ".join(str(text)[:4000].split())
    for secret in secrets:
        if secret and len(secret) >= 4:
            line = line.replace(secret, "[redacted]")
    line = _SECRETISH.sub(lambda m: (m.group(1) or "") + "[redacted]", line)
    if len(line) > _MAX_SERVER_TEXT:
        line = line[:_MAX_SERVER_TEXT] + "…"
    return line


def safe_url(url: Any) -> str:
    """``url`` for a repr or a message: userinfo, query and fragment removed (they may hold credentials)."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(invalid URL)"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a rate-limited / overloaded request (429, 529, 503) before any event was yielded.

    Bounded three ways: ``max_attempts``, ``max_total_wait`` seconds of sleeping in one turn, and a
    ``retry-after`` longer than ``max_delay`` fails at once rather than parking the run.
    """

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_total_wait: float = 60.0
    retry_statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503, 529}))

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        if retry_after is not None and retry_after >= 0:
            return retry_after
        return min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))


def retry_after_from(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (preferred, as the Anthropic SDK does) or ``retry-after``."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000
            if value >= 0:
                return value
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``retry-after`` header (delta-seconds form only; dates are ignored)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def tool_schemas(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tools as ``{name, description, input_schema}`` (what both adapters start from)."""
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


@runtime_checkable
class Backend(Protocol):
    """A model endpoint. ``name`` is the value of ``run.start``'s ``backend``."""

    name: str

    def allows_model(self, model: str) -> bool:
        """True when this backend is configured to serve ``model``."""

    def stream_turn(self, model: str, system: str, messages: list[dict[str, Any]],
                    tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        """Stream one assistant turn. Raises :class:`BackendFailure`; cancellation closes the stream."""


async def stream_with_retries(policy: RetryPolicy, open_stream, sleep=None) -> AsyncIterator[TurnEvent]:
    """Run ``open_stream()`` (an async iterator factory), retrying retryable failures that happen
    before the first event. Once an event was yielded a failure is final: the turn cannot be
    replayed without duplicating text the client has already seen."""
    import asyncio

    sleep = sleep or asyncio.sleep
    waited = 0.0
    attempt = 0
    while True:
        attempt += 1
        yielded = False
        try:
            async for event in open_stream():
                yielded = True
                yield event
            return
        except BackendFailure as exc:
            if yielded or not exc.retryable or attempt >= policy.max_attempts:
                raise
            delay = policy.delay(attempt, exc.retry_after)
            if delay > policy.max_delay or waited + delay > policy.max_total_wait:
                raise failure(Code.BACKEND_ERROR,
                              f"the model endpoint is rate limited (HTTP {exc.status}); retry after {delay:g} s",
                              advice=STATUS_ADVICE[429], status=exc.status, retry_after=delay,
                              error_type=exc.error_type) from exc
            waited += delay
            await sleep(delay)


def model_allowed(model: str, patterns: Iterable[str]) -> bool:
    """True when ``model`` equals a pattern or starts with a pattern's prefix before ``*``."""
    for pattern in patterns:
        if pattern == "*" or pattern == model:
            return True
        if pattern.endswith("*") and model.startswith(pattern[:-1]):
            return True
    return False


class StreamingBackend(ABC):
    """What the HTTP backends share: the model allowlist, and retries around one streamed request.
    A subclass sets ``models`` and ``retry`` and implements ``_one`` (one attempt of one turn)."""

    models: tuple[str, ...]
    retry: RetryPolicy

    def allows_model(self, model: str) -> bool:
        """Model allowlist check (exact names or ``prefix*`` patterns)."""
        return model_allowed(model, self.models)

    def stream_turn(self, model: str, system: str, messages: list[dict[str, Any]],
                    tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        """Stream one turn (see :class:`Backend`), retrying rate limits before the first event."""
        return stream_with_retries(self.retry, lambda: self._one(model, system, messages, tools, max_tokens))

    @abstractmethod
    def _one(self, model: str, system: str, messages: list[dict[str, Any]],
             tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        """One attempt at one turn, in the backend's own wire format."""
