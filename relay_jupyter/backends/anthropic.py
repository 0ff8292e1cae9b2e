"""The ``anthropic`` backend: streaming Messages API with tools through the official SDK.

Uses ``messages.create(stream=True)`` (raw events; about 2.4x the throughput of the
``messages.stream`` helper, see STACK.md) with the SDK's own retries off (``max_retries=0``):
retries of 429/529 are ours, honoring ``retry-after`` and bounded by :class:`RetryPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from ..core.types import ToolSpec
from ..core.types import Usage as TokenUsage
from .base import (
    BackendFailure,
    RetryPolicy,
    Stop,
    StreamingBackend,
    TextDelta,
    ToolCallDone,
    TurnEvent,
    UsageEvent,
    retry_after_from,
    tool_schemas,
)

__all__ = ["DEFAULT_MODELS", "AnthropicBackend"]

#: Models served when the configuration names none. Patterns end in ``*`` for a prefix.
DEFAULT_MODELS: tuple[str, ...] = ("claude-*",)


def _usage_from(obj: Any, previous: TokenUsage | None) -> TokenUsage:
    """Merge an SDK usage object into the running total. ``message_delta.usage`` is cumulative;
    fields it leaves out (None) keep their earlier value."""
    prev = previous or TokenUsage()
    def pick(name: str) -> int:
        value = getattr(obj, name, None)
        return int(value) if value is not None else getattr(prev, name)
    return TokenUsage(input_tokens=pick("input_tokens"), output_tokens=pick("output_tokens"),
                      cache_creation_input_tokens=pick("cache_creation_input_tokens"),
                      cache_read_input_tokens=pick("cache_read_input_tokens"))


class AnthropicBackend(StreamingBackend):
    """Claude through the Anthropic Messages API. The key is held by the SDK client only."""

    name = "anthropic"

    def __init__(self, api_key: str, *, base_url: str | None = None, models: Iterable[str] = DEFAULT_MODELS,
                 retry: RetryPolicy | None = None, timeout: float = 120.0) -> None:
        import anthropic  # the broker side only; kept out of the kernel's import path

        self._anthropic = anthropic
        self._client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0,
                                                timeout=timeout)
        self.models = tuple(models)
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never show the key
        return f"AnthropicBackend(base_url={str(self._client.base_url)!r}, models={self.models!r})"

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.close()

    async def _one(self, model: str, system: str, messages: list[dict[str, Any]],
                   tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        anthropic = self._anthropic
        kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages,
                                  "stream": True}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tool_schemas(tools)
        try:
            stream = await self._client.messages.create(**kwargs)
        except anthropic.APIStatusError as exc:
            raise self._status_failure(exc) from None
        except anthropic.APIConnectionError as exc:
            raise BackendFailure(f"cannot reach the Anthropic endpoint ({type(exc).__name__})") from None
        usage: TokenUsage | None = None
        blocks: dict[int, dict[str, Any]] = {}
        stop_reason = "end_turn"
        try:
            async for event in stream:
                kind = event.type
                if kind == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        yield TextDelta(delta.text)
                    elif delta.type == "input_json_delta":
                        block = blocks.get(event.index)
                        if block is not None:
                            block["json"].append(delta.partial_json)
                elif kind == "content_block_start":
                    cb = event.content_block
                    if cb.type == "tool_use":
                        blocks[event.index] = {"id": cb.id, "name": cb.name, "json": []}
                    elif cb.type == "text" and cb.text:
                        yield TextDelta(cb.text)
                elif kind == "content_block_stop":
                    block = blocks.pop(event.index, None)
                    if block is not None:
                        yield _tool_call(block)
                elif kind == "message_start":
                    usage = _usage_from(event.message.usage, None)
                    yield UsageEvent(usage)
                elif kind == "message_delta":
                    if event.delta.stop_reason:
                        stop_reason = event.delta.stop_reason
                    if event.usage is not None:
                        usage = _usage_from(event.usage, usage)
                        yield UsageEvent(usage)
        except anthropic.APIStatusError as exc:
            raise self._status_failure(exc) from None
        except anthropic.APIError as exc:
            raise BackendFailure(f"the Anthropic stream failed ({type(exc).__name__})") from None
        finally:
            await stream.close()
        yield Stop(stop_reason)

    def _status_failure(self, exc: Any) -> BackendFailure:
        status = getattr(exc, "status_code", None)
        retry_after = retry_after_from(exc.response.headers) if exc.response is not None else None
        retryable = status in self.retry.retry_statuses
        # The SDK message may quote the request; keep only the status and the API's error type.
        detail = ""
        body = getattr(exc, "body", None)
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict) and isinstance(err.get("type"), str):
                detail = f" ({err['type'][:80]})"
        return BackendFailure(f"the Anthropic API answered HTTP {status}{detail}", status=status,
                              retry_after=retry_after, retryable=retryable)


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
