"""A misbehaving model server on 127.0.0.1: the failures real servers and networks produce, on demand.

    from relay_jupyter.testing.fault_model_server import FaultModelServer

    with FaultModelServer(fault="stall_pings", interval=0.05) as server:
        AnthropicBackend(key, base_url=server.base_url)        # POST /v1/messages
        OpenAIBackend(server.openai_base_url, key)             # POST /v1/chat/completions
        server.fault = "truncate"                              # change it between requests

It speaks both streaming protocols of :class:`~relay_jupyter.testing.FakeAnthropic` (Anthropic
Messages SSE: ``event:`` + ``data:`` frames) and :class:`~relay_jupyter.testing.FakeOpenAI` (chat
completions ``data:`` lines, ``[DONE]``), and every request gets the current :attr:`fault`:

============== ====================================================================================
``ok``         a complete answer (``text``), with usage and the end marker
``stall_pings`` the start of an answer, then keep-alives every ``interval`` s and nothing else
               (Anthropic ``event: ping``, OpenAI ``: keep-alive`` comments), for ``max_seconds``
``stall_silent`` the start of an answer, then silence (no byte at all) for ``max_seconds``
``trickle``    one word every ``interval`` s, for ``max_seconds``, never finishing in time
``truncate``   text and a tool call whose block never closes, then a clean end of the HTTP body
               without the end marker (Anthropic: no ``message_stop``; OpenAI: no ``finish_reason``,
               no ``[DONE]``)
``oversized``  text, then one SSE line of ``oversize_bytes`` with no newline (written in 64 KiB pieces,
               so the server itself stays small)
``malformed_json`` text, then a ``data:`` line that is not JSON
``malformed_sse``  text, then an event of the right type but the wrong shape
``cut``        text, then the TCP connection is dropped mid-body
``error_event`` text, then the protocol's error event (``error_type`` / ``error_message``)
``huge_usage`` a complete answer reporting 10**12 input and output tokens
``negative_usage`` a complete answer reporting negative token counts
``no_usage``   a complete answer with no usage at all (as llama.cpp streams)
============== ====================================================================================

A test double, not a production server (see :mod:`relay_jupyter.testing.loopback`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from ..protocol.sse import encode_raw
from .loopback import ClientDisconnected, HTTPRequest, LoopbackServer, RecordedRequest, Responder

__all__ = ["FAULTS", "FaultModelServer"]

FAULTS = ("ok", "stall_pings", "stall_silent", "trickle", "truncate", "oversized", "malformed_json",
          "malformed_sse", "cut", "error_event", "huge_usage", "negative_usage", "no_usage")
_PIECE = 64 * 1024


class FaultModelServer(LoopbackServer):
    """One fake model server, both protocols, one configurable fault (see the module docstring).

    Args:
        fault: the fault every request gets (one of :data:`FAULTS`); change :attr:`fault` any time.
        text: the answer text (split into words, one per delta).
        interval: seconds between keep-alives (``stall_pings``) or words (``trickle``).
        max_seconds: how long ``stall_pings`` / ``trickle`` go on before the server gives up.
        oversize_bytes: length of the ``oversized`` line.
        error_type, error_message: what ``error_event`` reports.
        api_key: when set, requests with another key get 401.
    """

    def __init__(self, fault: str = "ok", *, text: str = "the fault server starts an answer",
                 interval: float = 0.05, max_seconds: float = 30.0, oversize_bytes: int = 64 * 1024 * 1024,
                 error_type: str = "overloaded_error", error_message: str = "Overloaded",
                 api_key: str | None = None) -> None:
        super().__init__(api_key=api_key)
        self.fault = fault
        self.text = text
        self.interval = interval
        self.max_seconds = max_seconds
        self.oversize_bytes = oversize_bytes
        self.error_type = error_type
        self.error_message = error_message
        #: bytes of the oversized line actually sent before the client went away
        self.oversize_sent = 0

    @property
    def fault(self) -> str:
        """The current fault."""
        return self._fault

    @fault.setter
    def fault(self, value: str) -> None:
        if value not in FAULTS:
            raise ValueError(f"unknown fault {value!r}; one of {', '.join(FAULTS)}")
        self._fault = value

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (OpenAI clients expect the ``/v1``)."""
        return self.base_url + "/v1"

    # ----- serving ---------------------------------------------------------------------------------
    async def handle(self, request: HTTPRequest, record: RecordedRequest, responder: Responder) -> None:
        """``POST /v1/messages`` (Anthropic) and ``POST /v1/chat/completions`` (OpenAI)."""
        path = request.path.rstrip("/")
        if request.method != "POST" or path not in ("/v1/messages", "/v1/chat/completions"):
            await responder.send(404, {"error": {"type": "not_found_error", "message": "not found"}})
            return
        if not self.key_ok(request):
            await responder.send(401, {"error": {"type": "authentication_error", "message": "invalid key"}})
            return
        body = record.body if isinstance(record.body, dict) else {}
        wire: _Wire = _Anthropic(responder, body) if path == "/v1/messages" else _OpenAI(responder, body)
        try:
            await responder.start_stream({"request-id": f"req_fault{secrets.token_hex(6)}"})
            await self._play(wire, responder)
        except ClientDisconnected:
            return

    async def _play(self, wire: _Wire, responder: Responder) -> None:
        fault = self.fault
        words = self.text.split(" ")
        await wire.start(usage=fault not in ("no_usage",))
        if fault == "stall_pings":
            await wire.text(words[0] + " ")
            deadline = time.monotonic() + self.max_seconds
            while time.monotonic() < deadline:
                await asyncio.sleep(self.interval)
                await wire.keep_alive()
            await responder.end()
            return
        if fault == "stall_silent":
            await wire.text(words[0] + " ")
            await asyncio.sleep(self.max_seconds)
            await responder.end()
            return
        if fault == "trickle":
            deadline = time.monotonic() + self.max_seconds
            i = 0
            while time.monotonic() < deadline:
                await wire.text(words[i % len(words)] + " ")
                i += 1
                await asyncio.sleep(self.interval)
            await responder.end()
            return
        for word in words[:-1]:
            await wire.text(word + " ")
        await wire.text(words[-1])
        if fault == "truncate":
            await wire.open_tool_call()
            await responder.end()  # a clean end of the body, but no end marker
            return
        if fault == "oversized":
            await responder.write(b"data: {\"x\": \"")
            piece = b"A" * _PIECE
            while self.oversize_sent < self.oversize_bytes:
                await responder.write(piece)
                self.oversize_sent += len(piece)
            await responder.write(b"\"}\n\n")
            await responder.end()
            return
        if fault == "malformed_json":
            await wire.not_json()
            await responder.end()
            return
        if fault == "malformed_sse":
            await wire.wrong_shape()
            await responder.end()
            return
        if fault == "cut":
            await responder.abort()
            return
        if fault == "error_event":
            await wire.error(self.error_type, self.error_message)
            await responder.end()
            return
        usage = {"huge_usage": (10**12, 10**12), "negative_usage": (-1000, -500)}.get(fault)
        await wire.finish(usage, with_usage=fault != "no_usage")
        await responder.end()


class _Wire:
    """One protocol's frames."""

    def __init__(self, responder: Responder, body: dict[str, Any]) -> None:
        self.r = responder
        self.model = str(body.get("model") or "fault-model")

    async def not_json(self) -> None:
        await self.r.write(b'data: {"type": "content_block_delta", "delta": {"text": \n\n')

    async def start(self, usage: bool) -> None: ...
    async def text(self, text: str) -> None: ...
    async def keep_alive(self) -> None: ...
    async def open_tool_call(self) -> None: ...
    async def wrong_shape(self) -> None: ...
    async def error(self, error_type: str, message: str) -> None: ...
    async def finish(self, usage: tuple[int, int] | None, with_usage: bool) -> None: ...


class _Anthropic(_Wire):
    async def emit(self, event: str, data: dict[str, Any]) -> None:
        await self.r.write(encode_raw(None, event, data))

    async def start(self, usage: bool) -> None:
        message: dict[str, Any] = {"id": f"msg_fault{secrets.token_hex(6)}", "type": "message",
                                   "role": "assistant", "model": self.model, "content": [],
                                   "stop_reason": None, "stop_sequence": None}
        if usage:
            message["usage"] = {"input_tokens": 10, "output_tokens": 1}
        await self.emit("message_start", {"type": "message_start", "message": message})
        await self.emit("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})

    async def text(self, text: str) -> None:
        await self.emit("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": text}})

    async def keep_alive(self) -> None:
        await self.emit("ping", {"type": "ping"})

    async def not_json(self) -> None:
        await self.r.write(b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": \n\n')

    async def open_tool_call(self) -> None:
        await self.emit("content_block_stop", {"type": "content_block_stop", "index": 0})
        await self.emit("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_fault_open", "name": "write_file", "input": {}}})
        await self.emit("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {
            "type": "input_json_delta", "partial_json": '{"path": "x.txt", "content": "never'}})

    async def wrong_shape(self) -> None:
        await self.emit("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": 42})

    async def error(self, error_type: str, message: str) -> None:
        await self.emit("error", {"type": "error", "error": {"type": error_type, "message": message}})

    async def finish(self, usage: tuple[int, int] | None, with_usage: bool) -> None:
        await self.emit("content_block_stop", {"type": "content_block_stop", "index": 0})
        delta: dict[str, Any] = {"type": "message_delta",
                                 "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
        if with_usage:
            inp, out = usage or (10, 8)
            delta["usage"] = {"input_tokens": inp, "output_tokens": out}
        await self.emit("message_delta", delta)
        await self.emit("message_stop", {"type": "message_stop"})


class _OpenAI(_Wire):
    def __init__(self, responder: Responder, body: dict[str, Any]) -> None:
        super().__init__(responder, body)
        self.base = {"id": f"chatcmpl-fault{secrets.token_hex(6)}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": self.model}

    async def chunk(self, delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> None:
        data = dict(self.base)
        data["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        data.update(extra)
        await self.r.write(b"data: " + json.dumps(data).encode() + b"\n\n")

    async def start(self, usage: bool) -> None:
        await self.chunk({"role": "assistant", "content": ""})

    async def text(self, text: str) -> None:
        await self.chunk({"content": text})

    async def keep_alive(self) -> None:
        await self.r.write(b": keep-alive\n\n")

    async def open_tool_call(self) -> None:
        call = {"index": 0, "id": "call_fault_open", "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "x.txt", "content": "never'}}
        await self.chunk({"tool_calls": [call]})

    async def wrong_shape(self) -> None:
        await self.r.write(b'data: {"choices": [{"index": 0, "delta": "not an object"}]}\n\n')

    async def error(self, error_type: str, message: str) -> None:
        await self.r.write(b"data: " + json.dumps({"error": {"type": error_type, "message": message,
                                                             "code": None}}).encode() + b"\n\n")

    async def finish(self, usage: tuple[int, int] | None, with_usage: bool) -> None:
        await self.chunk({}, "stop")
        if with_usage:
            inp, out = usage or (10, 8)
            await self.chunk(None, usage={"prompt_tokens": inp, "completion_tokens": out,
                                          "total_tokens": inp + out})
        await self.r.write(b"data: [DONE]\n\n")
