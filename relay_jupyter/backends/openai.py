"""The ``openai`` backend: any ``/v1/chat/completions`` server with tools (OpenAI, Ollama, vLLM,
llama.cpp, LM Studio), streamed over ``httpx2`` without the ``openai`` package.

Tool calls arrive in pieces keyed by ``index`` (the ``id`` and ``name`` usually only in the
first piece); we assemble them by index and emit them in index order when the stream ends.

A turn is complete only when the server ended it: a ``finish_reason`` or ``data: [DONE]``. A stream
that ends without either is ``BACKEND_ERROR`` and its tool calls are dropped (never executed). Every
SSE line is capped while it is read (:func:`~relay_jupyter.backends.capped.capped_client`); an error
chunk reports the server's own error type and message (redacted); transport failures map to
``BACKEND_UNREACHABLE`` / ``BACKEND_TIMEOUT``.
Some servers send a usage chunk after ``data: [DONE]``, so we keep reading to the end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from ..core.types import ToolSpec
from ..core.types import Usage as TokenUsage
from ..core.errors import Code
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
    truncated,
)
from .capped import capped_client, transport_failure

__all__ = ["OpenAIBackend", "ServerTokenizer", "chat_url", "server_root", "to_openai_messages"]

_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use", "length": "max_tokens"}
_PROGRESS = Progress()
_MAX_ERROR_BODY = 64 * 1024


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
                 retry: RetryPolicy | None = None, timeout: float = 120.0,
                 max_event_bytes: int = MAX_SSE_EVENT) -> None:
        import httpx2  # broker side only

        self._httpx = httpx2
        headers = {"accept": "text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._key = api_key
        self._timeout = timeout
        self._url = chat_url(base_url)
        self._server = f"the model server at {safe_url(self._url)}"
        self._client = capped_client(max_event_bytes, timeout=httpx2.Timeout(timeout, connect=10.0),
                                     headers=headers, url=self._url)
        self.models = tuple(models)
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never show the key, nor credentials a URL may carry
        return f"OpenAIBackend(url={safe_url(self._url)!r}, models={self.models!r})"

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    async def _one(self, model: str, system: str, messages: list[dict[str, Any]],
                   tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        body: dict[str, Any] = {"model": model, "messages": to_openai_messages(system, messages),
                                "stream": True, "max_tokens": max_tokens,
                                "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = _tools(tools)
        calls: dict[int, dict[str, Any]] = {}
        finish = "end_turn"
        ended = False  # a finish_reason or [DONE] arrived
        try:
            async with self._client.stream("POST", self._url, json=body) as resp:
                if resp.status_code != 200:
                    raise await self._status_failure(resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # comments (": keep-alive"), event:/id: lines, blank lines
                    data = line[5:].strip()
                    if not data:
                        continue
                    if data == "[DONE]":
                        ended = True
                        continue  # keep reading: a usage chunk may follow [DONE]
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise failure(Code.BACKEND_ERROR,
                                      f"{self._server} sent a malformed stream chunk (not JSON)") from None
                    if not isinstance(chunk, dict):
                        raise failure(Code.BACKEND_ERROR,
                                      f"{self._server} sent a malformed stream chunk (not a JSON object)")
                    if chunk.get("error") is not None:
                        raise self._error_failure(chunk["error"], "mid-stream")
                    try:
                        if isinstance(chunk.get("usage"), dict):
                            yield UsageEvent(_usage(chunk["usage"]))
                        for choice in chunk.get("choices") or ():
                            delta = choice.get("delta") or {}
                            text = delta.get("content")
                            if isinstance(text, str) and text:
                                yield TextDelta(text)
                            pieces = delta.get("tool_calls") or ()
                            for piece in pieces:
                                _collect(calls, piece)
                            if pieces or delta.get("reasoning_content"):
                                yield _PROGRESS
                            if choice.get("finish_reason"):
                                finish = _FINISH.get(choice["finish_reason"], choice["finish_reason"])
                                ended = True
                    except (AttributeError, TypeError, ValueError):
                        raise failure(Code.BACKEND_ERROR, f"{self._server} sent a malformed stream chunk "
                                                          "(unexpected shape)") from None
        except BackendFailure:
            raise
        except Exception as exc:
            found = transport_failure(exc, self._server, read_timeout=self._timeout)
            if found is None:
                raise
            raise found from None
        if not ended:
            raise truncated()  # the open tool calls are dropped: never executed
        for index in sorted(calls):
            yield _done(calls[index])
        if calls and finish == "end_turn":
            finish = "tool_use"  # some servers say "stop" even when they called tools
        yield Stop(finish)

    async def _status_failure(self, resp: Any) -> BackendFailure:
        """An HTTP error answer, with the server's error type and message when it sent JSON."""
        raw = b""
        async for piece in resp.aiter_bytes():
            raw += piece
            if len(raw) > _MAX_ERROR_BODY:
                break
        error: Any = None
        try:
            parsed = json.loads(raw[:_MAX_ERROR_BODY])
            error = parsed.get("error") if isinstance(parsed, dict) else None
        except ValueError:
            pass
        status = resp.status_code
        what, error_type = self._error_text(error, f"HTTP {status}") if error is not None else \
            (f"{self._server} answered HTTP {status}", None)
        return failure(Code.BACKEND_ERROR, what, status=status, retry_after=retry_after_from(resp.headers),
                       advice=STATUS_ADVICE.get(status),
                       retryable=status in self.retry.retry_statuses, error_type=error_type)

    def _error_failure(self, error: Any, when: str) -> BackendFailure:
        """``{"error": {"type", "message", "code"}}`` (or a bare string) as a BACKEND_ERROR."""
        what, error_type = self._error_text(error, when)
        return failure(Code.BACKEND_ERROR, what, error_type=error_type)

    def _error_text(self, error: Any, when: str) -> tuple[str, str | None]:
        error_type = message = None
        if isinstance(error, dict):
            kind = error.get("type") or error.get("code")
            error_type = redact(kind)[:80] if isinstance(kind, (str, int)) else None
            if isinstance(error.get("message"), str):
                message = redact(error["message"], (self._key,))
        elif isinstance(error, str):
            message = redact(error, (self._key,))
        said = f"{error_type or 'error'}: {message}" if message else (error_type or "an error")
        if when == "mid-stream":
            what = f"{self._server} failed mid-stream ({said})"
        else:
            what = f"{self._server} answered {when} ({said})"
        return what, error_type


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


# ---- token counts from the server's own tokenizer (issue 12: estimates for local models) ---------------

#: Text longer than this is not sent to the server to be counted (the conservative bound is used).
MAX_TOKENIZE_CHARS = 1 << 20


def server_root(base_url: str) -> str:
    """The server's root from an OpenAI-compatible base URL (``http://h:p/v1`` -> ``http://h:p``)."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        base = base[: -len("/chat/completions")]
    if base.endswith("/v1"):
        base = base[:-3]
    return base


class ServerTokenizer:
    """Counts tokens with the OpenAI-compatible server's own tokenizer when the server has one: llama.cpp's
    ``llama-server`` (``POST /tokenize`` ``{"content"}`` -> ``{"tokens": [...]}``) or llama-cpp-python
    (``POST /extras/tokenize/count`` ``{"input"}`` -> ``{"count"}``). Which one answers is learnt on first
    use and remembered; a server with neither (OpenAI, vLLM without the route, Ollama) makes :meth:`count`
    return None for good, and the caller uses the conservative bound (``core/budgets.estimate_text_tokens``).

    Hand-written on ``httpx2``: no library speaks these two routes, and each is one small POST.
    """

    _ROUTES = (("/tokenize", "content"), ("/extras/tokenize/count", "input"))

    def __init__(self, base_url: str, client: Any, headers: dict[str, str] | None = None,
                 timeout: float = 10.0) -> None:
        self._root = server_root(base_url)
        self._client = client
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._route: tuple[str, str] | None = None
        self._known = False  # True once a route answered, or every route failed

    @property
    def available(self) -> bool | None:
        """True: the server counts; False: it cannot; None: not asked yet."""
        if not self._known:
            return None
        return self._route is not None

    async def count(self, text: str) -> int | None:
        """The server's token count of ``text`` (special tokens such as BOS may be included: it never
        undercounts), or None when the server has no tokenizer route, the text is too long or the
        server failed to answer."""
        if len(text) > MAX_TOKENIZE_CHARS or (self._known and self._route is None):
            return None
        routes = (self._route,) if self._route is not None else self._ROUTES
        refused = 0
        for route in routes:
            assert route is not None
            n = await self._ask(route, text)
            if isinstance(n, int):
                self._route, self._known = route, True
                return n
            refused += n == "refused"
        if self._route is None and refused == len(self._ROUTES):
            self._known = True  # the server answered both routes with an error: it has no tokenizer (asked once)
        return None

    async def _ask(self, route: tuple[str, str], text: str) -> int | str:
        """The count, ``"refused"`` (the server answered, not with a count) or ``"failed"`` (no answer)."""
        path, field = route
        try:
            resp = await self._client.post(self._root + path, json={field: text}, headers=self._headers,
                                           timeout=self._timeout)
        except Exception:  # noqa: BLE001 - a count is an optimisation: any failure means "use the bound"
            return "failed"
        if resp.status_code != 200:
            return "refused"
        try:
            body = resp.json()
        except ValueError:
            return "refused"
        if isinstance(body, dict) and isinstance(body.get("tokens"), list):
            return len(body["tokens"])
        count = body.get("count") if isinstance(body, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            return count
        return "refused"
