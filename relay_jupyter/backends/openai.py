"""The ``openai`` backend: any ``/v1/chat/completions`` server with tools (OpenAI, Ollama, vLLM,
llama.cpp, LM Studio), streamed over ``httpx2`` without the ``openai`` package.

Tool calls arrive in pieces keyed by ``index`` (the ``id`` and ``name`` usually only in the
first piece); we assemble them by index and emit them in index order when the stream ends.
Some servers send a usage chunk after ``data: [DONE]``, so we keep reading to the end.
"""

from __future__ import annotations

import json
import uuid
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
)

__all__ = ["OpenAIBackend", "chat_url", "to_openai_messages"]

_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use", "length": "max_tokens"}
_MAX_LINE = 8 * 1024 * 1024  # a single SSE line beyond this is a flood, not a chunk


def chat_url(base_url: str) -> str:
    """``…/v1/chat/completions`` from a base URL given with or without ``/v1``
    (Ollama ``http://127.0.0.1:11434``, LM Studio ``http://127.0.0.1:1234/v1``, …)."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def to_openai_messages(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized (Anthropic-like) messages -> chat-completions messages.

    tool_result blocks become ``role: tool`` messages placed before any text of the same user
    message, so every assistant ``tool_calls`` entry is answered right after it.
    """
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for msg in messages:
        role, content = msg["role"], msg["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            calls = [b for b in content if b.get("type") == "tool_use"]
            if calls:
                entry["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c.get("input") or {})}}
                    for c in calls
                ]
            out.append(entry)
            continue
        for block in content:
            if block.get("type") == "tool_result":
                body = block.get("content", "")
                if not isinstance(body, str):
                    body = json.dumps(body)
                if block.get("is_error"):
                    body = "ERROR: " + body
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": body})
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.input_schema}} for t in tools]


class OpenAIBackend(StreamingBackend):
    """A chat-completions endpoint. ``api_key`` may be None for local servers that need none."""

    name = "openai"

    def __init__(self, base_url: str, api_key: str | None = None, *, models: Iterable[str] = ("*",),
                 retry: RetryPolicy | None = None, timeout: float = 120.0) -> None:
        import httpx2  # broker side only

        self._httpx = httpx2
        headers = {"accept": "text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._url = chat_url(base_url)
        self._client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout, connect=10.0))
        self.models = tuple(models)
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIBackend(url={self._url!r}, models={self.models!r})"

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    async def _one(self, model: str, system: str, messages: list[dict[str, Any]],
                   tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        httpx = self._httpx
        body: dict[str, Any] = {"model": model, "messages": to_openai_messages(system, messages),
                                "stream": True, "max_tokens": max_tokens,
                                "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = _tools(tools)
        calls: dict[int, dict[str, Any]] = {}
        finish = "end_turn"
        try:
            async with self._client.stream("POST", self._url, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise BackendFailure(
                        f"the model endpoint answered HTTP {resp.status_code}", status=resp.status_code,
                        retry_after=retry_after_from(resp.headers),
                        retryable=resp.status_code in self.retry.retry_statuses)
                async for line in resp.aiter_lines():
                    if len(line) > _MAX_LINE:
                        raise BackendFailure("the model endpoint sent an oversized stream line")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if not data or data == "[DONE]":
                        continue  # keep reading: a usage chunk may follow [DONE]
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise BackendFailure("the model endpoint sent a malformed stream chunk") from None
                    if not isinstance(chunk, dict):
                        continue
                    if isinstance(chunk.get("error"), dict):
                        raise BackendFailure("the model endpoint reported an error mid-stream")
                    if isinstance(chunk.get("usage"), dict):
                        yield UsageEvent(_usage(chunk["usage"]))
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        text = delta.get("content")
                        if isinstance(text, str) and text:
                            yield TextDelta(text)
                        for piece in delta.get("tool_calls") or ():
                            _collect(calls, piece)
                        if choice.get("finish_reason"):
                            finish = _FINISH.get(choice["finish_reason"], choice["finish_reason"])
        except httpx.HTTPError as exc:
            raise BackendFailure(f"cannot reach the model endpoint ({type(exc).__name__})") from None
        for index in sorted(calls):
            yield _done(calls[index])
        if calls and finish == "end_turn":
            finish = "tool_use"  # some servers say "stop" even when they called tools
        yield Stop(finish)


def _collect(calls: dict[int, dict[str, Any]], piece: dict[str, Any]) -> None:
    index = piece.get("index", len(calls))
    if not isinstance(index, int):
        return
    slot = calls.setdefault(index, {"id": None, "name": "", "args": []})
    if piece.get("id"):
        slot["id"] = piece["id"]
    fn = piece.get("function") or {}
    if fn.get("name"):
        slot["name"] += fn["name"] if not slot["name"] else ""
    if isinstance(fn.get("arguments"), str):
        slot["args"].append(fn["arguments"])


def _done(slot: dict[str, Any]) -> ToolCallDone:
    call_id = slot["id"] or f"call_{uuid.uuid4().hex[:16]}"
    text = "".join(slot["args"])
    size = len(text.encode())
    if not text.strip():
        return ToolCallDone(call_id, slot["name"], {}, None, size)
    try:
        value = json.loads(text)
    except ValueError:
        return ToolCallDone(call_id, slot["name"], {}, text[:1000], size)
    if not isinstance(value, dict):
        return ToolCallDone(call_id, slot["name"], {}, text[:1000], size)
    return ToolCallDone(call_id, slot["name"], value, None, size)


def _usage(raw: dict[str, Any]) -> TokenUsage:
    details = raw.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    prompt = int(raw.get("prompt_tokens") or 0)
    return TokenUsage(input_tokens=max(prompt - cached, 0), output_tokens=int(raw.get("completion_tokens") or 0),
                      cache_read_input_tokens=cached)
