"""A fake Anthropic Messages API on 127.0.0.1, driven by a script of replies.

    from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

    with FakeAnthropic(api_key="test-key") as fake:
        fake.enqueue(Reply(text("Checking."), tool_use("echo", {"text": "hé"})))
        client = anthropic.AsyncAnthropic(api_key="test-key", base_url=fake.base_url, max_retries=0)
        ...
        assert fake.last_request.body["model"] == "claude-x"

It speaks the wire protocol of ``POST /v1/messages`` (also ``?beta=true``), streaming and not:
``message_start``, ``content_block_start``/``_delta``/``_stop`` (text split into several ``text_delta``
chunks, tool input split by :func:`~relay_jupyter.testing.script.split_json` at awkward places),
``message_delta`` with cumulative usage, ``message_stop``, ``ping`` events, and ``error`` events
mid-stream. Errors use the API's JSON shape ``{"type": "error", "error": {"type", "message"}}``.
Also ``POST /v1/messages/count_tokens`` and ``GET /v1/models``.
"""

from __future__ import annotations

import secrets
from typing import Any

from ..protocol.sse import encode_raw
from .loopback import CLOSE, ClientDisconnected, HTTPRequest, RecordedRequest, Responder
from .script import (
    Block,
    ErrorReply,
    Reply,
    TextBlock,
    ThinkingBlock,
    count_tokens,
    split_json,
    split_text,
)
from .scripted import Pacer, ScriptedServer, count_request_tokens

__all__ = ["ERROR_TYPES", "FakeAnthropic", "count_request_tokens"]

#: HTTP status -> the Anthropic API error type.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
_MESSAGES = {
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit (fake)",
    "overloaded_error": "Overloaded",
    "api_error": "Internal server error",
}
_ROLES = ("user", "assistant", "system")


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """The API's error JSON."""
    return {"type": "error", "error": {"type": error_type, "message": message},
            "request_id": f"req_fake{secrets.token_hex(8)}"}


def validate_request(body: Any) -> str | None:
    """Why ``body`` is not a valid Messages request, or None. Checks what catches client bugs."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required (an integer >= 1)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: Field required (a non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if not isinstance(content, (str, list)):
            return f"messages.{i}.content: Field required"
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    return f"messages.{i}.content.{j}.type: Field required"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: Input should be a valid boolean"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                return f"tools.{i}.name: Field required"
    return None


def _block_json(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}


class FakeAnthropic(ScriptedServer):
    """A real HTTP server speaking the Anthropic Messages API from a queue of scripted replies.

    Args:
        api_key: when set, requests carrying another key (``x-api-key`` or ``Authorization: Bearer``)
            get 401 ``authentication_error``; when None any key is accepted.
        default: what to answer when the queue is empty (default: ``"(fake) no scripted reply"``).
        max_body_bytes: larger request bodies get 413 ``request_too_large``.
        models: ids listed by ``GET /v1/models``.
        require_version: answer 400 to requests without the ``anthropic-version`` header, as the real
            API does (the SDK always sends it).
    """

    def __init__(
        self,
        api_key: str | None = None,
        default: Reply | str | None = None,
        max_body_bytes: int = 32 * 1024 * 1024,
        models: tuple[str, ...] = ("claude-fake-1",),
        require_version: bool = True,
    ) -> None:
        super().__init__(api_key=api_key, default=default, max_body_bytes=max_body_bytes)
        self.models = models
        self.require_version = require_version

    # ----- serving --------------------------------------------------------------------------------
    async def bad_request(self, responder: Responder, status: int, message: str) -> None:
        """Malformed HTTP answers in the API's error shape."""
        await responder.send(status, error_body(ERROR_TYPES.get(status, "invalid_request_error"), message), CLOSE)

    async def _error(self, responder: Responder, status: int, message: str | None = None,
                     error_type: str | None = None, headers: dict[str, str] | None = None,
                     body: Any = None) -> None:
        kind = error_type or ERROR_TYPES.get(status, "api_error")
        payload = body if body is not None else error_body(kind, message or _MESSAGES.get(kind, kind))
        await responder.send(status, payload, headers)

    async def handle(self, request: HTTPRequest, record: RecordedRequest, responder: Responder) -> None:
        """Route: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /v1/models``."""
        routes = {"/v1/messages": "POST", "/v1/messages/count_tokens": "POST", "/v1/models": "GET"}
        path = request.path.rstrip("/")
        if path not in routes:
            await self._error(responder, 404, f"Not found: {request.path}")
            return
        if request.method != routes[path]:
            await self._error(responder, 405, f"Method {request.method} not allowed")
            return
        if not self.key_ok(request):
            missing = self.presented_key(request) is None
            await self._error(responder, 401, "x-api-key header is required" if missing else "invalid x-api-key")
            return
        if "anthropic-version" not in request.headers and self.require_version:
            await self._error(responder, 400, "anthropic-version: header is required")
            return
        if path == "/v1/models":
            data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                    for m in self.models]
            await responder.send(200, {"data": data, "has_more": False,
                                       "first_id": self.models[0] if self.models else None,
                                       "last_id": self.models[-1] if self.models else None})
            return
        if record.body is None and request.body:
            await self._error(responder, 400, "request body is not valid JSON")
            return
        if path == "/v1/messages/count_tokens":
            body = record.body
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                await self._error(responder, 400, "messages: Field required")
                return
            await responder.send(200, {"input_tokens": count_request_tokens(body)})
            return
        problem = validate_request(record.body)
        if problem:
            await self._error(responder, 400, problem)
            return
        item = self.script.pop()
        if isinstance(item, ErrorReply):
            await self._scripted_error(responder, item)
            return
        body = record.body
        if body.get("stream"):
            await self._stream(responder, item, body)
        elif item.drop_after is not None:
            await responder.abort()
        elif item.error_after is not None:
            await self._error(responder, 529, error_type=item.error_type)
        else:
            await responder.send(200, self._message(item, body), {"request-id": _request_id()})

    async def _scripted_error(self, responder: Responder, item: ErrorReply) -> None:
        headers = {"request-id": _request_id(), **self.retry_headers(item)}
        await self._error(responder, item.status, item.message, item.error_type, headers, item.body)

    def _usage(self, reply: Reply, body: dict[str, Any], output_tokens: int) -> dict[str, int]:
        usage = reply.usage
        return {
            "input_tokens": usage.input_tokens if usage and usage.input_tokens is not None
            else count_request_tokens(body),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens if usage else 0,
            "cache_read_input_tokens": usage.cache_read_input_tokens if usage else 0,
        }

    def _message(self, reply: Reply, body: dict[str, Any], stream_start: bool = False) -> dict[str, Any]:
        return {
            "id": f"msg_fake{secrets.token_hex(8)}",
            "type": "message",
            "role": "assistant",
            "model": reply.model or body["model"],
            "content": [] if stream_start else [_block_json(b) for b in reply.blocks],
            "stop_reason": None if stream_start else reply.final_stop_reason,
            "stop_sequence": None,
            # message_start reports 1 output token so far, as the real API does
            "usage": self._usage(reply, body, 1 if stream_start else reply.output_tokens()),
        }

    async def _stream(self, responder: Responder, reply: Reply, body: dict[str, Any]) -> None:
        """The SSE event sequence of the real API, paced as scripted."""

        async def emit(event_type: str, data: dict[str, Any]) -> None:
            await responder.write(encode_raw(None, event_type, data))

        pacer = Pacer(reply.first_token_delay, reply.tokens_per_second)
        deltas = 0
        try:
            await responder.start_stream({"request-id": _request_id()})
            await emit("message_start", {"type": "message_start",
                                         "message": self._message(reply, body, stream_start=True)})
            await emit("ping", {"type": "ping"})
            for index, block in enumerate(reply.blocks):
                start, pieces = _block_deltas(block, reply.chunk_tokens)
                await emit("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": start})
                for delta_type, key, chunk, tokens in pieces:
                    if reply.drop_after is not None and deltas >= reply.drop_after:
                        await responder.abort()
                        return
                    if reply.error_after is not None and deltas >= reply.error_after:
                        await self._stream_error(emit, responder, reply)
                        return
                    await pacer.wait(tokens)
                    await emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": delta_type, key: chunk}})
                    deltas += 1
                await emit("content_block_stop", {"type": "content_block_stop", "index": index})
                if index + 1 < len(reply.blocks):
                    await emit("ping", {"type": "ping"})
            if reply.drop_after is not None:
                await responder.abort()
                return
            if reply.error_after is not None:
                await self._stream_error(emit, responder, reply)
                return
            await emit("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": reply.final_stop_reason, "stop_sequence": None},
                "usage": self._usage(reply, body, reply.output_tokens()),  # cumulative totals
            })
            await emit("message_stop", {"type": "message_stop"})
            await responder.end()
        except ClientDisconnected:
            return  # the client went away: recorded as disconnected

    async def _stream_error(self, emit: Any, responder: Responder, reply: Reply) -> None:
        kind = reply.error_type
        await emit("error", error_body(kind, _MESSAGES.get(kind, kind)))
        await responder.end()


def _block_deltas(block: Block, chunk_tokens: int) -> tuple[dict[str, Any], list[tuple[str, str, str, int]]]:
    """The ``content_block_start`` payload of a block and its deltas as (delta type, field, value,
    tokens for pacing)."""
    start = _block_json(block)
    if isinstance(block, TextBlock):
        start["text"] = ""
        return start, [("text_delta", "text", c, count_tokens(c) or 1)
                       for c in split_text(block.text, chunk_tokens)]
    if isinstance(block, ThinkingBlock):
        start.update(thinking="", signature="")
        pieces = [("thinking_delta", "thinking", c, count_tokens(c) or 1)
                  for c in split_text(block.thinking, chunk_tokens)]
        return start, [*pieces, ("signature_delta", "signature", block.signature, 0)]
    start["input"] = {}
    return start, [("input_json_delta", "partial_json", c, 1) for c in split_json(block.input)]


def _request_id() -> str:
    return f"req_fake{secrets.token_hex(8)}"
