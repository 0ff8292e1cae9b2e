"""The ``anthropic`` backend: streaming Messages API with tools through the official SDK.

Uses ``messages.create(stream=True)`` through ``with_streaming_response`` and reads the SDK's raw
server-sent events (``AsyncStream.raw_events``) as JSON: about 2x less CPU per streamed delta than the
SDK's typed events, which were 2.4x less than the ``messages.stream`` helper. The SDK's own retries are
off (``max_retries=0``):
retries of 429/529 are ours, honoring ``retry-after`` and bounded by :class:`RetryPolicy`.

The SDK's HTTP client is ours (:func:`~relay_jupyter.backends.capped.capped_client`): every SSE event
is capped while it is read, redirects are not followed. The turn is complete only when the stream
sent ``message_stop``; a stream that ends before it is ``BACKEND_ERROR`` and a tool block that never
closed is dropped (never executed). Transport failures map to ``BACKEND_UNREACHABLE`` /
``BACKEND_TIMEOUT``; an ``error`` event reports the API's own error type and message (redacted).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from ..core.errors import Code
from ..core.types import ToolSpec
from ..core.types import Usage as TokenUsage
from .base import (
    MAX_SSE_EVENT,
    STATUS_ADVICE,
    BackendFailure,
    Progress,
    RetryPolicy,
    Stop,
    StreamingBackend,
    TextDelta,
    ToolCallDone,
    TurnEvent,
    UsageEvent,
    failure,
    redact,
    retry_after_from,
    safe_url,
    tool_schemas,
    truncated,
)
from .capped import capped_client, transport_failure

__all__ = ["DEFAULT_MODELS", "AnthropicBackend"]

#: Models served when the configuration names none. Patterns end in ``*`` for a prefix.
DEFAULT_MODELS: tuple[str, ...] = ("claude-*",)
_SERVER = "the Anthropic API"
_PROGRESS = Progress()


def _usage_from(obj: Any, previous: TokenUsage | None) -> TokenUsage:
    """Merge a stream event's ``usage`` object into the running total. ``message_delta.usage`` is
    cumulative; fields it leaves out (absent or null) keep their earlier value."""
    prev = previous or TokenUsage()
    obj = obj or {}
    def pick(name: str) -> int:
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(name)  # a malformed event, not a count
        return value if value is not None else getattr(prev, name)
    return TokenUsage(input_tokens=pick("input_tokens"), output_tokens=pick("output_tokens"),
                      cache_creation_input_tokens=pick("cache_creation_input_tokens"),
                      cache_read_input_tokens=pick("cache_read_input_tokens"))


class AnthropicBackend(StreamingBackend):
    """Claude through the Anthropic Messages API. The key is held by the SDK client only."""

    name = "anthropic"

    def __init__(self, api_key: str, *, base_url: str | None = None, models: Iterable[str] = DEFAULT_MODELS,
                 retry: RetryPolicy | None = None, timeout: float = 120.0,
                 max_event_bytes: int = MAX_SSE_EVENT) -> None:
        import anthropic  # the broker side only; kept out of the kernel's import path
        import httpx2

        self._anthropic = anthropic
        self._httpx = httpx2
        self._key = api_key
        self._timeout = timeout
        self._http = capped_client(max_event_bytes, timeout=httpx2.Timeout(timeout, connect=10.0),
                                   url=base_url)
        self._client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0,
                                                timeout=timeout, http_client=self._http)
        self.models = tuple(models)
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never show the key, nor credentials a URL may carry
        return f"AnthropicBackend(base_url={safe_url(self._client.base_url)!r}, models={self.models!r})"

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.close()
        await self._http.aclose()

    async def _one(self, model: str, system: str, messages: list[dict[str, Any]],
                   tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        anthropic = self._anthropic
        kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages,
                                  "stream": True}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tool_schemas(tools)
        # The SDK builds and sends the request and raises its status errors; the events are read as the
        # SDK's raw server-sent events (``AsyncStream.raw_events``, its own decoder) and handled as the
        # JSON they are. Building the SDK's typed event objects was about 60 % of the broker's CPU per
        # streamed delta (issue 18: 64 concurrent runs, benchmarks/README.md run H); nothing here needs them.
        usage: TokenUsage | None = None
        blocks: dict[int, dict[str, Any]] = {}
        stop_reason = "end_turn"
        complete = False
        try:
            async with self._client.messages.with_streaming_response.create(**kwargs) as opened:
                async for sse in anthropic.AsyncStream.raw_events(opened.http_response):
                    kind = sse.event
                    # what the SDK's own stream skips: keep-alives, events with no name or no data
                    if kind is None or kind == "ping" or not sse.data:
                        continue
                    if kind == "error":  # the API's error inside a 200 stream
                        try:
                            body: Any = sse.json()
                        except ValueError:
                            body = None
                        raise self._mid_stream_failure(body)
                    event = sse.json()  # not JSON: ValueError, a malformed stream (self._failure)
                    try:
                        kind = event["type"]
                        if kind == "content_block_delta":
                            delta = event["delta"]
                            dtype = delta["type"]
                            if dtype == "text_delta":
                                yield TextDelta(_text(delta["text"]))
                            elif dtype == "input_json_delta":
                                block = blocks.get(event["index"])
                                if block is not None:
                                    block["json"].append(_text(delta["partial_json"]))
                                yield _PROGRESS
                            else:  # thinking, signatures, citations: content, not a keep-alive
                                yield _PROGRESS
                        elif kind == "content_block_start":
                            cb = event["content_block"]
                            if cb["type"] == "tool_use":
                                blocks[event["index"]] = {"id": _text(cb["id"]), "name": _text(cb["name"]),
                                                          "json": []}
                                yield _PROGRESS
                            elif cb["type"] == "text" and cb.get("text"):
                                yield TextDelta(_text(cb["text"]))
                        elif kind == "content_block_stop":
                            block = blocks.pop(event["index"], None)
                            if block is not None:
                                yield _tool_call(block)
                        elif kind == "message_start":
                            usage = _usage_from(event["message"].get("usage"), None)
                            yield UsageEvent(usage)
                        elif kind == "message_delta":
                            if event["delta"].get("stop_reason"):
                                stop_reason = _text(event["delta"]["stop_reason"])
                            if event.get("usage") is not None:
                                usage = _usage_from(event["usage"], usage)
                                yield UsageEvent(usage)
                        elif kind == "message_stop":
                            complete = True
                    except (AttributeError, TypeError, KeyError, ValueError):
                        kind = redact(str(kind) if isinstance(kind, str) else "?")[:40]
                        raise failure(Code.BACKEND_ERROR, f"{_SERVER} sent a malformed stream event ({kind})") from None
        except BackendFailure:
            raise
        except anthropic.APIStatusError as exc:  # the request's status (4xx/5xx): the SDK raised it on open
            raise self._status_failure(exc) from None
        except Exception as exc:
            raise self._failure(exc) from None
        if not complete:
            # a clean end of stream without message_stop: the answer (and any open tool block) is cut
            raise truncated()
        if blocks:  # message_stop with a tool block never closed: that call is incomplete, never run
            raise failure(Code.BACKEND_ERROR, f"{_SERVER} ended the answer with a tool call still open")
        yield Stop(stop_reason)

    def _failure(self, exc: BaseException) -> BackendFailure:
        """A transport, SDK or decoding exception as its code; anything unknown propagates as a bug."""
        found = transport_failure(exc, _SERVER, read_timeout=self._timeout)
        if found is not None:
            return found
        anthropic = self._anthropic
        if isinstance(exc, anthropic.APITimeoutError):
            return failure(Code.BACKEND_TIMEOUT, f"{_SERVER} did not answer within {self._timeout:g} s")
        if isinstance(exc, anthropic.APIConnectionError):
            return failure(Code.BACKEND_UNREACHABLE, f"cannot reach {_SERVER} ({type(exc).__name__})")
        if isinstance(exc, ValueError):  # sse.json() on a data line that is not JSON
            return failure(Code.BACKEND_ERROR, f"{_SERVER} sent a malformed stream event (not JSON)")
        if isinstance(exc, anthropic.APIError):
            return failure(Code.BACKEND_ERROR, f"the Anthropic stream failed ({type(exc).__name__})")
        raise exc

    def _mid_stream_failure(self, body: Any) -> BackendFailure:
        """An ``error`` event inside a 200 stream (what the SDK raises as a status error with status 200)."""
        return self._api_failure(200, None, body)

    def _status_failure(self, exc: Any) -> BackendFailure:
        retry_after = retry_after_from(exc.response.headers) if exc.response is not None else None
        return self._api_failure(getattr(exc, "status_code", None), retry_after, getattr(exc, "body", None))

    def _api_failure(self, status: int | None, retry_after: float | None, body: Any) -> BackendFailure:
        # an ``error`` event inside a 200 stream arrives as a status error with status 200
        mid_stream = status == 200
        retryable = status in self.retry.retry_statuses and not mid_stream
        # The SDK's own message may quote the request: show only the API's error type and message.
        error_type = message = None
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict):
                if isinstance(err.get("type"), str):
                    error_type = redact(err["type"])[:80]
                if isinstance(err.get("message"), str):
                    message = redact(err["message"], (self._key,))
        said = f"{error_type or 'error'}: {message}" if message else (error_type or "an error")
        if mid_stream:
            what = f"{_SERVER} failed mid-stream ({said})"
        else:
            what = f"{_SERVER} answered HTTP {status} ({said})"
        return failure(Code.BACKEND_ERROR, what, status=None if mid_stream else status,
                       advice=None if mid_stream else STATUS_ADVICE.get(status or 0),
                       retry_after=retry_after, retryable=retryable, error_type=error_type)


def _text(value: Any) -> str:
    """A string field of a stream event; anything else is a malformed event (TypeError)."""
    if not isinstance(value, str):
        raise TypeError(type(value).__name__)
    return value


def _tool_call(block: dict[str, Any]) -> ToolCallDone:
    text = "".join(block["json"])
    size = len(text.encode())
    if not text.strip():
        return ToolCallDone(block["id"], block["name"], {}, None, size)
    try:
        value = json.loads(text)
    except ValueError:
        return ToolCallDone(block["id"], block["name"], {}, text[:1000], size)
    if not isinstance(value, dict):
        return ToolCallDone(block["id"], block["name"], {}, text[:1000], size)
    return ToolCallDone(block["id"], block["name"], value, None, size)
