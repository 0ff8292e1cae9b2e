"""A fake OpenAI-compatible Chat Completions server on 127.0.0.1, driven by the same script as
:class:`~relay_jupyter.testing.FakeAnthropic`.

    with FakeOpenAI(api_key="k") as fake:
        fake.enqueue(Reply(text("Sure."), tool_use("add", {"a": 1, "b": 2})))
        # POST {fake.base_url}/v1/chat/completions  (base_url already ends in /v1)

Endpoints: ``POST /v1/chat/completions`` (``stream: true`` gives SSE ``data: {chunk}`` lines ending in
``data: [DONE]``; ``stream_options.include_usage`` adds a final usage chunk) and ``GET /v1/models``.
Tool calls stream as ``delta.tool_calls[i]`` with ``index``, ``id``, ``function.name`` in the first chunk
and ``function.arguments`` split at awkward places over later chunks. Stop reasons map to
``finish_reason``: end_turn -> stop, tool_use -> tool_calls, max_tokens -> length.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from .loopback import CLOSE, ClientDisconnected, HTTPRequest, RecordedRequest, Responder
from .script import (
    ErrorReply,
    Reply,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    count_tokens,
    split_json,
    split_text,
)
from .scripted import Pacer, ScriptedServer, count_request_tokens

__all__ = ["FINISH_REASONS", "FakeOpenAI"]

#: Anthropic-style stop reason (as scripted) -> OpenAI finish_reason.
FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}
_ERRORS = {  # status -> (type, code, message)
    400: ("invalid_request_error", None, "Invalid request"),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided"),
    404: ("invalid_request_error", "unknown_url", "Unknown request URL"),
    405: ("invalid_request_error", None, "Method not allowed"),
    413: ("invalid_request_error", "request_too_large", "Request too large"),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached (fake)"),
    500: ("server_error", None, "The server had an error while processing your request"),
    503: ("server_error", "overloaded", "The engine is currently overloaded"),
    529: ("server_error", "overloaded", "The engine is currently overloaded"),
}
_ROLES = ("system", "developer", "user", "assistant", "tool")


def error_body(status: int, message: str | None = None, error_type: str | None = None) -> dict[str, Any]:
    """The OpenAI error JSON for ``status``."""
    kind, code, default = _ERRORS.get(status, ("server_error", None, "error"))
    return {"error": {"message": message or default, "type": error_type or kind, "param": None, "code": code}}


def validate_request(body: Any) -> str | None:
    """Why ``body`` is not a valid chat completion request, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: expected a non-empty array"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return f"messages[{i}].role: invalid"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"{key}: expected an integer >= 1"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: expected a boolean"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: expected an array"
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                return f"tools[{i}].function.name: required"
    return None


class FakeOpenAI(ScriptedServer):
    """A real HTTP server speaking OpenAI Chat Completions from a queue of scripted replies.

    Args:
        api_key: when set, a request whose ``Authorization: Bearer`` key differs gets 401.
        default: what to answer when the queue is empty.
        max_body_bytes: larger request bodies get 413.
        models: ids listed by ``GET /v1/models``.
        stream_usage: when False, a streamed answer carries no usage even when the request asks for
            it (``stream_options.include_usage``), as a llama.cpp server streams.
    """

    def __init__(self, api_key: str | None = None, default: Reply | str | None = None,
                 max_body_bytes: int = 32 * 1024 * 1024, models: tuple[str, ...] = ("gpt-fake-1",),
                 stream_usage: bool = True) -> None:
        super().__init__(api_key=api_key, default=default, max_body_bytes=max_body_bytes)
        self.models = models
        self.stream_usage = stream_usage

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: OpenAI clients expect the ``/v1`` in the base URL."""
        return super().base_url + "/v1"

    async def bad_request(self, responder: Responder, status: int, message: str) -> None:
        """Malformed HTTP answers in the OpenAI error shape."""
        await responder.send(status, error_body(status, message), CLOSE)

    async def handle(self, request: HTTPRequest, record: RecordedRequest, responder: Responder) -> None:
        """Route: ``POST /v1/chat/completions``, ``GET /v1/models``."""
        routes = {"/v1/chat/completions": "POST", "/v1/models": "GET"}
        path = request.path.rstrip("/")
        if path not in routes:
            await responder.send(404, error_body(404, f"Unknown request URL: {request.method} {request.path}"))
            return
        if request.method != routes[path]:
            await responder.send(405, error_body(405))
            return
        if not self.key_ok(request):
            await responder.send(401, error_body(401))
            return
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
            await responder.send(200, {"object": "list", "data": data})
            return
        if record.body is None and request.body:
            await responder.send(400, error_body(400, "We could not parse the JSON body of your request."))
            return
        problem = validate_request(record.body)
        if problem:
            await responder.send(400, error_body(400, problem))
            return
        item = self.script.pop()
        body = record.body
        if isinstance(item, ErrorReply):
            payload = item.body if item.body is not None else error_body(item.status, item.message,
                                                                          item.error_type)
            await responder.send(item.status, payload, self.retry_headers(item))
        elif body.get("stream"):
            await self._stream(responder, item, body)
        elif item.drop_after is not None:
            await responder.abort()
        elif item.error_after is not None:
            await responder.send(503, error_body(503))
        else:
            await responder.send(200, self._completion(item, body))

    def _usage(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        u = reply.usage
        prompt = u.input_tokens if u and u.input_tokens is not None else count_request_tokens(body)
        completion = reply.output_tokens()
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_input_tokens if u else 0},
        }

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        texts = [b.text for b in reply.blocks if isinstance(b, TextBlock)]
        calls = [{"id": b.id, "type": "function",
                  "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in reply.blocks if isinstance(b, ToolUseBlock)]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
        reasoning = [b.thinking for b in reply.blocks if isinstance(b, ThinkingBlock)]
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-fake{secrets.token_hex(8)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": FINISH_REASONS[reply.final_stop_reason]}],
            "usage": self._usage(reply, body),
        }

    async def _stream(self, responder: Responder, reply: Reply, body: dict[str, Any]) -> None:
        """``data: {chunk}`` lines as the OpenAI API sends them, then ``data: [DONE]``."""
        include_usage = self.stream_usage and bool((body.get("stream_options") or {}).get("include_usage"))
        base = {"id": f"chatcmpl-fake{secrets.token_hex(8)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": reply.model or body["model"]}

        async def chunk(delta: dict[str, Any] | None, finish: str | None = None,
                        usage: dict[str, Any] | None = None) -> None:
            data = dict(base)
            data["choices"] = [] if delta is None else [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            if include_usage:
                data["usage"] = usage
            await responder.write(b"data: " + json.dumps(data).encode() + b"\n\n")

        pacer = Pacer(reply.first_token_delay, reply.tokens_per_second)
        deltas = 0
        call_index = 0
        try:
            await responder.start_stream()
            await chunk({"role": "assistant", "content": ""})
            for block in reply.blocks:
                if isinstance(block, TextBlock):
                    pieces = [({"content": c}, count_tokens(c) or 1)
                              for c in split_text(block.text, reply.chunk_tokens)]
                elif isinstance(block, ThinkingBlock):
                    pieces = [({"reasoning_content": c}, count_tokens(c) or 1)
                              for c in split_text(block.thinking, reply.chunk_tokens)]
                else:
                    args = split_json(block.input)
                    first = {"index": call_index, "id": block.id, "type": "function",
                             "function": {"name": block.name, "arguments": args[0]}}
                    pieces = [({"tool_calls": [first]}, 1)] + [
                        ({"tool_calls": [{"index": call_index, "function": {"arguments": a}}]}, 1)
                        for a in args[1:]]
                    call_index += 1
                for delta, tokens in pieces:
                    if reply.drop_after is not None and deltas >= reply.drop_after:
                        await responder.abort()
                        return
                    if reply.error_after is not None and deltas >= reply.error_after:
                        await self._stream_error(responder)
                        return
                    await pacer.wait(tokens)
                    await chunk(delta)
                    deltas += 1
            if reply.drop_after is not None:
                await responder.abort()
                return
            if reply.error_after is not None:
                await self._stream_error(responder)
                return
            await chunk({}, FINISH_REASONS[reply.final_stop_reason])
            if include_usage:
                await chunk(None, usage=self._usage(reply, body))
            await responder.write(b"data: [DONE]\n\n")
            await responder.end()
        except ClientDisconnected:
            return

    async def _stream_error(self, responder: Responder) -> None:
        # OpenAI-compatible servers report a mid-stream failure as a data line holding an error object
        await responder.write(b"data: " + json.dumps(error_body(503)).encode() + b"\n\n")
        await responder.end()
