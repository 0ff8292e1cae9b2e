"""FakeAnthropic driven by the official anthropic SDK (and raw httpx2 for hostile input)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import anthropic
import httpx2
import pytest

from relay_jupyter.protocol.sse import parse_stream
from relay_jupyter.testing import FakeAnthropic, Reply, Usage, text, thinking, tool_use
from relay_jupyter.testing.script import split_json

KEY = "test-key-sk-ant-xyz"
MSG = [{"role": "user", "content": "hello there"}]
VERSION = {"anthropic-version": "2023-06-01"}
RAW = {"x-api-key": KEY, **VERSION}


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def client(fake: FakeAnthropic, **kw) -> anthropic.AsyncAnthropic:
    kw.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(api_key=kw.pop("api_key", KEY), base_url=fake.base_url, **kw)


@pytest.mark.asyncio
async def test_stream_text_reassembles_and_reports_scripted_usage(fake):
    fake.enqueue(Reply(text("The quick brown fox jumps over the lazy dog."),
                       usage=Usage(input_tokens=42, output_tokens=9, cache_creation_input_tokens=5,
                                   cache_read_input_tokens=7)))
    async with client(fake) as c:
        texts = []
        async with c.messages.stream(model="claude-x", max_tokens=100, messages=MSG) as s:
            async for ev in s:
                if ev.type == "text":
                    texts.append(ev.text)
            final = await s.get_final_message()
    assert len(texts) >= 3  # really split into several deltas
    assert "".join(texts) == "The quick brown fox jumps over the lazy dog."
    assert final.stop_reason == "end_turn"
    assert final.model == "claude-x"
    u = final.usage
    assert (u.input_tokens, u.output_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (
        42, 9, 5, 7)


@pytest.mark.asyncio
async def test_stream_tool_use_input_survives_awkward_splits(fake):
    tool_input = {"path": "notes/caf\u00e9.txt", "text": 'line "one"\nline\ttwo \\ end', "n": [1, 2.5, None]}
    fake.enqueue(Reply(text("Writing it."), tool_use("write_note", tool_input, id="toolu_1")))
    pieces = split_json(tool_input)
    assert pieces[0] == "" and any(p.endswith("\\") for p in pieces) and any(p.startswith(":") for p in pieces)
    async with client(fake) as c:
        partial = []
        async with c.messages.stream(model="m", max_tokens=50, messages=MSG,
                                     tools=[{"name": "write_note", "input_schema": {"type": "object"}}]) as s:
            async for ev in s:
                if ev.type == "input_json":
                    partial.append(ev.partial_json)
            final = await s.get_final_message()
    assert "".join(partial) == json.dumps(tool_input, ensure_ascii=True)
    assert final.stop_reason == "tool_use"
    block = final.content[1]
    assert (block.type, block.id, block.name, block.input) == ("tool_use", "toolu_1", "write_note", tool_input)
    assert final.usage.output_tokens == Reply(text("Writing it."), tool_use("w", tool_input)).output_tokens()


@pytest.mark.asyncio
async def test_raw_stream_event_order_and_cumulative_usage(fake):
    fake.enqueue(Reply("a b c d e f g", tool_use("echo", {"text": "x"}), stop_reason="max_tokens"))
    async with client(fake) as c:
        stream = await c.messages.create(model="m", max_tokens=5, messages=MSG, stream=True)
        events = [ev async for ev in stream]
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert types[-2] == "message_delta"
    assert types.count("content_block_start") == types.count("content_block_stop") == 2
    start, delta = events[0], events[-2]
    assert start.message.usage.output_tokens == 1
    assert delta.delta.stop_reason == "max_tokens"
    assert delta.usage.output_tokens == 7 + 3  # 7 words + tool input ('{"text": "x"}' = 2 words, +1)
    assert delta.usage.input_tokens == 2  # "hello there"


@pytest.mark.asyncio
async def test_ping_events_are_on_the_wire(fake):
    fake.enqueue(Reply("one two", tool_use("t", {})))
    async with httpx2.AsyncClient(base_url=fake.base_url) as h:
        r = await h.post("/v1/messages?beta=true", headers=RAW,
                         json={"model": "m", "max_tokens": 9, "messages": MSG, "stream": True})
    frames, rest = parse_stream(r.text)
    kinds = [f["event"] for f in frames]
    assert rest == "" and kinds.count("ping") == 2
    assert all(json.loads(f["data"])["type"] == f["event"] for f in frames)
    assert fake.last_request.query == {"beta": "true"}


@pytest.mark.asyncio
async def test_non_streaming_create(fake):
    fake.enqueue(Reply(text("hi"), tool_use("add", {"a": 1, "b": 2}, id="toolu_9")))
    async with client(fake) as c:
        msg = await c.messages.create(model="m", max_tokens=10, messages=MSG)
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[1].input == {"a": 1, "b": 2} and msg.stop_reason == "tool_use"


@pytest.mark.asyncio
async def test_default_reply_when_queue_empty():
    with FakeAnthropic(default="scripted default") as fake:
        async with client(fake) as c:
            msg = await c.messages.create(model="m", max_tokens=10, messages=MSG)
        assert msg.content[0].text == "scripted default"
    with FakeAnthropic() as fake:
        async with client(fake) as c:
            msg = await c.messages.create(model="m", max_tokens=10, messages=MSG)
        assert msg.content[0].text == "(fake) no scripted reply"


@pytest.mark.asyncio
async def test_429_with_retry_after_is_retried_by_the_sdk(fake):
    fake.enqueue_error(status=429, retry_after=0.05)
    fake.enqueue("after retry")
    async with client(fake, max_retries=1) as c:
        msg = await c.messages.create(model="m", max_tokens=10, messages=MSG)
    assert msg.content[0].text == "after retry"
    statuses = [r.status for r in fake.requests]
    assert statuses == [429, 200]


@pytest.mark.asyncio
async def test_429_and_529_surface_as_sdk_errors_without_retries(fake):
    fake.enqueue_error(status=429, retry_after=2)
    fake.enqueue_error(status=529)
    async with client(fake) as c:
        with pytest.raises(anthropic.RateLimitError) as info:
            await c.messages.create(model="m", max_tokens=10, messages=MSG)
        assert info.value.response.headers["retry-after"] == "2"
        assert info.value.body["error"]["type"] == "rate_limit_error"
        with pytest.raises(anthropic.APIStatusError) as info529:
            await c.messages.create(model="m", max_tokens=10, messages=MSG)
        assert info529.value.status_code == 529
        assert info529.value.body["error"]["type"] == "overloaded_error"


@pytest.mark.asyncio
async def test_wrong_key_gets_401(fake):
    async with client(fake, api_key="wrong") as c:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await c.messages.create(model="m", max_tokens=10, messages=MSG)
    assert info.value.body["error"]["type"] == "authentication_error"
    assert fake.saw_api_key("wrong") and not fake.saw_api_key(KEY)


@pytest.mark.asyncio
async def test_error_event_mid_stream_raises_in_sdk(fake):
    fake.enqueue(Reply("many words are streamed here before it breaks", error_after=2))
    async with client(fake) as c:
        seen = []
        with pytest.raises(anthropic.APIStatusError) as info:
            async with c.messages.stream(model="m", max_tokens=10, messages=MSG) as s:
                async for ev in s:
                    if ev.type == "text":
                        seen.append(ev.text)
    assert len(seen) == 2
    assert "overloaded_error" in str(info.value.body)


@pytest.mark.asyncio
async def test_requests_are_recorded_with_key_redacted(fake):
    fake.enqueue("ok")
    async with client(fake) as c:
        await c.messages.create(model="claude-y", max_tokens=10, messages=MSG, system="be brief")
    req = fake.last_request
    assert (req.method, req.path, req.status, req.completed) == ("POST", "/v1/messages", 200, True)
    assert req.body["model"] == "claude-y" and req.body["system"] == "be brief"
    assert KEY not in json.dumps(req.headers) and KEY not in repr(fake.requests)
    assert req.headers["authorization"] == "[REDACTED]"
    assert fake.saw_api_key(KEY) and not fake.saw_api_key(KEY + "x")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"max_tokens": 5, "messages": MSG}).encode(), "model"),
        (json.dumps({"model": "m", "messages": MSG}).encode(), "max_tokens"),
        (json.dumps({"model": "m", "max_tokens": True, "messages": MSG}).encode(), "max_tokens"),
        (json.dumps({"model": "m", "max_tokens": 5, "messages": []}).encode(), "messages"),
        (json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}).encode(),
         "role"),
        (json.dumps({"model": "m", "max_tokens": 5, "messages": MSG, "stream": "yes"}).encode(), "stream"),
    ],
)
async def test_invalid_requests_get_400_in_api_shape(fake, body, needle):
    async with httpx2.AsyncClient(base_url=fake.base_url) as h:
        r = await h.post("/v1/messages", headers={**RAW, "content-type": "application/json"},
                         content=body)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]
    assert fake.pending == 0  # nothing consumed from the script


@pytest.mark.asyncio
async def test_oversized_body_unknown_path_and_method():
    with FakeAnthropic(max_body_bytes=1000) as fake:
        async with httpx2.AsyncClient(base_url=fake.base_url, headers=VERSION) as h:
            big = await h.post("/v1/messages", json={"model": "m", "max_tokens": 1,
                                                     "messages": [{"role": "user", "content": "x" * 2000}]})
            missing = await h.post("/v1/../etc/passwd", json={})
            method = await h.get("/v1/messages")
            models = await h.get("/v1/models")
            count = await h.post("/v1/messages/count_tokens", json={"model": "m", "messages": MSG})
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    assert missing.status_code == 404 and method.status_code == 405
    assert models.json()["data"][0]["id"] == "claude-fake-1"
    assert count.json() == {"input_tokens": 2}


def test_garbage_on_the_socket_gets_400_and_server_survives():
    with FakeAnthropic() as fake:
        junks = [
            b"NOT HTTP\r\n\r\n",
            b"GET / HTTP/9\r\n\r\n",
            b"POST /v1/messages HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
            b"POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        ]
        for junk in junks:
            with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as s:
                s.sendall(junk)
                assert s.recv(100).startswith(b"HTTP/1.1 400")
        with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        # still serving
        assert httpx2.get(fake.base_url + "/v1/models", headers=VERSION).status_code == 200


def test_sync_client_and_client_disconnect_is_recorded():
    with FakeAnthropic() as fake:
        fake.enqueue(Reply(" ".join(["w"] * 200), chunk_tokens=1, tokens_per_second=400))
        c = anthropic.Anthropic(api_key="k", base_url=fake.base_url, max_retries=0)
        with c.messages.stream(model="m", max_tokens=9, messages=MSG) as s:
            for ev in s:
                if ev.type == "text":
                    break  # leave early: closes the response
        c.close()
        req = fake.requests[0]
        assert req.wait_finished(timeout=5)
        assert req.disconnected and not req.completed


@pytest.mark.asyncio
async def test_pacing_holds_deltas_back(fake):
    # Only lower bounds (a sleep guarantees them); the achieved rate is measured in benchmarks/bench_fakes.py.
    fake.enqueue(Reply("a b c d e f g h i j k", chunk_tokens=1, first_token_delay=0.15, tokens_per_second=100))
    stamps = []
    async with client(fake) as c:
        t0 = time.monotonic()
        async with c.messages.stream(model="m", max_tokens=10, messages=MSG) as s:
            async for ev in s:
                if ev.type == "text":
                    stamps.append(time.monotonic())
    assert len(stamps) == 11
    assert stamps[0] - t0 >= 0.15
    assert stamps[-1] - stamps[0] >= 0.1 - 0.005  # 10 tokens before the last delta at 100 tokens/s


@pytest.mark.asyncio
async def test_missing_anthropic_version_is_400(fake):
    async with httpx2.AsyncClient(base_url=fake.base_url) as h:
        r = await h.post("/v1/messages", headers={"x-api-key": KEY},
                         json={"model": "m", "max_tokens": 5, "messages": MSG})
    assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]


def test_expect_100_continue_and_chunked_request_body():
    body = json.dumps({"model": "m", "max_tokens": 5, "messages": MSG}).encode()
    with FakeAnthropic() as fake:
        fake.enqueue("chunked ok")
        with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as s:
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nanthropic-version: 2023-06-01\r\n"
                      b"expect: 100-continue\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
            assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            half = len(body) // 2
            for part in (body[:half], body[half:]):
                s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            s.sendall(b"0\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert json.loads(payload)["content"][0]["text"] == "chunked ok"
        assert fake.last_request.body["model"] == "m"


def test_a_bug_in_a_fake_is_a_500_and_kept_in_errors():
    class Broken(FakeAnthropic):
        async def handle(self, request, record, responder):
            raise RuntimeError("oops")

    with Broken() as fake:
        r = httpx2.get(fake.base_url + "/v1/models")
        assert r.status_code == 500 and "oops" in r.json()["error"]["message"]
        assert [type(e) for e in fake.errors] == [RuntimeError]


@pytest.mark.asyncio
async def test_concurrent_streams_each_get_one_scripted_reply(fake):
    fake.enqueue(*[f"reply number {i}" for i in range(8)])
    async with client(fake) as c:

        async def one() -> str:
            async with c.messages.stream(model="m", max_tokens=10, messages=MSG) as s:
                return await s.get_final_text()

        async with asyncio.timeout(20):
            answers = await asyncio.gather(*[one() for _ in range(8)])
    assert sorted(answers) == sorted(f"reply number {i}" for i in range(8))
    assert fake.pending == 0 and len(fake.requests) == 8


def test_stop_is_idempotent_and_base_url_needs_a_started_fake():
    fake = FakeAnthropic()
    with pytest.raises(RuntimeError, match="not started"):
        _ = fake.base_url
    fake.start()
    port = fake.port
    fake.stop()
    fake.stop()
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{port}/v1/models")


@pytest.mark.asyncio
async def test_thinking_block_streams_with_signature(fake):
    fake.enqueue(Reply(thinking("First I consider the numbers carefully.", signature="sig-1"), text("3")))
    async with client(fake) as c:
        kinds = []
        async with c.messages.stream(model="m", max_tokens=10, messages=MSG) as s:
            async for ev in s:
                kinds.append(ev.type)
            final = await s.get_final_message()
    block = final.content[0]
    assert (block.type, block.thinking, block.signature) == (
        "thinking", "First I consider the numbers carefully.", "sig-1")
    assert "thinking" in kinds and "signature" in kinds
    assert final.content[1].text == "3" and final.usage.output_tokens == 7


@pytest.mark.asyncio
async def test_dropped_connection_mid_stream_and_before_answer(fake):
    fake.enqueue(Reply("a b c d e f g h", chunk_tokens=1, drop_after=3), Reply("x", drop_after=0))
    async with client(fake) as c:
        seen = []
        with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
            async with c.messages.stream(model="m", max_tokens=10, messages=MSG) as s:
                async for ev in s:
                    if ev.type == "text":
                        seen.append(ev.text)
        assert seen == ["a ", "b ", "c "]
        with pytest.raises(anthropic.APIConnectionError):
            await c.messages.create(model="m", max_tokens=10, messages=MSG)
    assert [r.disconnected for r in fake.requests] == [True, True]
    assert not any(r.completed for r in fake.requests)
