"""The Anthropic backend reads the SDK's raw server-sent events as JSON (issue 18: the SDK's typed event
objects were most of the broker's CPU per delta). What the typed objects used to absorb is checked here
against a real HTTP server sending exact bytes: SSE framing the SDK's decoder accepts (CRLF, comments,
a frame split across network writes, ``ping``, unnamed events), fields of the wrong JSON type, and an
``error`` event whose data is not JSON. Every such stream ends in a ``BackendFailure`` or in the right
events, never in a crash or a delta that is not text."""

from __future__ import annotations

import json

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import BackendFailure, RetryPolicy, Stop, TextDelta, ToolCallDone, UsageEvent
from relay_jupyter.core.errors import Code
from relay_jupyter.testing.loopback import LoopbackServer

KEY = "sk-test-raw-events-0123456789"
MSGS = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def frame(event: str | None, data: object, eol: str = "\n") -> bytes:
    head = f"event: {event}{eol}" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}{eol}{eol}".encode()


START = frame("message_start", {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
    "usage": {"input_tokens": 7, "output_tokens": 1}}})
STOP = frame("message_stop", {"type": "message_stop"})


def delta(text: object, index: int = 0, eol: str = "\n") -> bytes:
    return frame("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "text_delta", "text": text}}, eol)


class RawServer(LoopbackServer):
    """Answers ``POST /v1/messages`` with the byte chunks in :attr:`chunks`, one network write each."""

    chunks: list[bytes] = []

    async def handle(self, request, record, responder) -> None:
        await responder.start_stream()
        for chunk in self.chunks:
            await responder.write(chunk)
        await responder.end()


async def run(chunks: list[bytes]) -> tuple[list[object], BackendFailure | None]:
    with RawServer(api_key=KEY) as server:
        server.chunks = chunks
        backend = AnthropicBackend(KEY, base_url=f"http://127.0.0.1:{server.port}",
                                   retry=RetryPolicy(max_attempts=1))
        seen: list[object] = []
        try:
            async for event in backend.stream_turn("claude-x", "", MSGS, [], 100):
                seen.append(event)
        except BackendFailure as exc:
            return seen, exc
        finally:
            await backend.aclose()
    return seen, None


@pytest.mark.asyncio
async def test_framing_the_decoder_accepts_gives_the_same_answer():
    split = delta("wor") + delta("ld")
    chunks = [
        START,
        b": a comment line\n\n",
        frame("ping", {"type": "ping"}),
        frame(None, {"type": "content_block_delta"}),  # no event name: skipped, as by the SDK
        frame("content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": "Hel"}}),
        delta("lo ", eol="\r\n"),
        split[:9], split[9:31], split[31:],  # frames split across network writes
        frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
        frame("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "tu1", "name": "echo", "input": {}}}),
        frame("content_block_delta", {"type": "content_block_delta", "index": 1,
                                      "delta": {"type": "input_json_delta", "partial_json": '{"te'}}),
        frame("content_block_delta", {"type": "content_block_delta", "index": 1,
                                      "delta": {"type": "input_json_delta", "partial_json": 'xt": "é"}'}}),
        frame("content_block_stop", {"type": "content_block_stop", "index": 1}),
        frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                "usage": {"output_tokens": 9}}),
        STOP,
    ]
    seen, exc = await run(chunks)
    assert exc is None
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "Hello world"
    (call,) = [e for e in seen if isinstance(e, ToolCallDone)]
    assert (call.id, call.name, call.input) == ("tu1", "echo", {"text": "é"})
    usage = [e for e in seen if isinstance(e, UsageEvent)][-1].usage
    assert (usage.input_tokens, usage.output_tokens) == (7, 9)  # message_delta's usage is cumulative
    assert seen[-1] == Stop("tool_use")


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [
    delta(5),                                           # text that is not a string
    delta(None),
    frame("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": "text"}),
    frame("content_block_delta", ["not", "an", "object"]),
    frame("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": "9"}}),
    frame("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": True}}),
    frame("content_block_start", {"type": "content_block_start", "index": 1,
                                  "content_block": {"type": "tool_use", "id": 3, "name": "echo"}}),
    frame("content_block_delta", "{not json"),
])
async def test_a_field_of_the_wrong_type_is_a_malformed_stream(bad):
    seen, exc = await run([START, delta("ok "), bad, delta("never"), STOP])
    assert exc is not None and exc.code is Code.BACKEND_ERROR and "malformed" in exc.message, exc
    texts = [e.text for e in seen if isinstance(e, TextDelta)]
    assert texts == ["ok "] and all(isinstance(t, str) for t in texts)
    assert not any(isinstance(e, Stop) for e in seen)


@pytest.mark.asyncio
async def test_error_events_fail_mid_stream_with_the_api_words_only():
    body = {"type": "error", "error": {"type": "overloaded_error", "message": f"Overloaded (key {KEY})"}}
    seen, exc = await run([START, delta("par"), frame("error", body), STOP])
    assert exc is not None and exc.code is Code.BACKEND_ERROR
    assert "failed mid-stream (overloaded_error: Overloaded" in exc.message and KEY not in exc.message
    assert exc.data.get("error_type") == "overloaded_error" and not exc.retryable
    # an error event whose data is not JSON: still a mid-stream failure, nothing of it quoted
    seen, exc = await run([START, frame("error", "<html>proxy says no</html>")])
    assert exc is not None and exc.code is Code.BACKEND_ERROR and "failed mid-stream" in exc.message
    assert "proxy" not in exc.message


@pytest.mark.asyncio
async def test_a_stream_without_message_stop_is_truncated_not_short():
    seen, exc = await run([START, delta("half an ans")])
    assert exc is not None and exc.code is Code.BACKEND_ERROR
    assert [e.text for e in seen if isinstance(e, TextDelta)] == ["half an ans"]
