"""FakeOpenAI driven by httpx2, the way an OpenAI-compatible backend reads it."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from relay_jupyter.testing import FakeOpenAI, Reply, Usage, text, thinking, tool_use

KEY = "sk-test-openai"
MSG = [{"role": "user", "content": "add two numbers please"}]
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def fake():
    with FakeOpenAI(api_key=KEY) as server:
        yield server


async def stream_chat(fake: FakeOpenAI, **body: Any) -> tuple[list[dict[str, Any]], bool]:
    """POST a streaming chat request; returns the parsed chunks and whether [DONE] arrived."""
    chunks: list[dict[str, Any]] = []
    done = False
    payload = {"model": "gpt-x", "messages": MSG, "stream": True, **body}
    async with (
        httpx2.AsyncClient(base_url=fake.base_url, headers=AUTH) as h,
        h.stream("POST", "/chat/completions", json=payload) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue  # keep reading after [DONE] (to the end of the body), as an OpenAI-compatible client should
            chunks.append(json.loads(line[6:]))
    return chunks, done


def assemble(chunks: list[dict[str, Any]]) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """Content text, tool calls by index, finish_reason."""
    content, calls, finish = "", {}, None
    for c in chunks:
        for choice in c["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return content, calls, finish


@pytest.mark.asyncio
async def test_streamed_text_and_two_tool_calls_assemble_by_index(fake):
    args0 = {"a": 1, "b": 2, "note": "caf\u00e9 \"x\"\n"}
    fake.enqueue(Reply(text("Let me add those."), tool_use("add", args0, id="call_0"),
                       tool_use("echo", {"text": "hi"}, id="call_1"), usage=Usage(input_tokens=11)))
    chunks, done = await stream_chat(fake, stream_options={"include_usage": True})
    assert done
    content, calls, finish = assemble(chunks)
    assert content == "Let me add those."
    assert finish == "tool_calls"
    assert [calls[i]["id"] for i in (0, 1)] == ["call_0", "call_1"]
    assert json.loads(calls[0]["arguments"]) == args0 and calls[0]["name"] == "add"
    assert json.loads(calls[1]["arguments"]) == {"text": "hi"}
    arg_pieces = [tc["function"]["arguments"] for c in chunks for ch in c["choices"]
                  for tc in ch["delta"].get("tool_calls") or [] if tc["index"] == 0]
    assert len(arg_pieces) > 3  # really split
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 11
    assert usage["usage"]["total_tokens"] == 11 + usage["usage"]["completion_tokens"]
    assert all(c["usage"] is None for c in chunks[:-1])


@pytest.mark.asyncio
async def test_stream_without_usage_and_finish_reasons(fake):
    fake.enqueue(Reply("cut short here", stop_reason="max_tokens"), "plain")
    chunks, done = await stream_chat(fake)
    assert done and assemble(chunks)[2] == "length"
    assert all("usage" not in c for c in chunks)
    chunks, _ = await stream_chat(fake)
    assert assemble(chunks)[:1] == ("plain",) and assemble(chunks)[2] == "stop"


@pytest.mark.asyncio
async def test_non_streaming_completion_and_models(fake):
    fake.enqueue(Reply(tool_use("add", {"a": 1}, id="call_9")))
    async with httpx2.AsyncClient(base_url=fake.base_url, headers=AUTH) as h:
        r = await h.post("/chat/completions", json={"model": "gpt-x", "messages": MSG})
        models = await h.get("/models")
    body = r.json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert body["usage"]["prompt_tokens"] == 4
    assert models.json()["data"][0]["id"] == "gpt-fake-1"


@pytest.mark.asyncio
async def test_rate_limit_wrong_key_and_bad_requests(fake):
    fake.enqueue_error(status=429, retry_after=1.5)
    async with httpx2.AsyncClient(base_url=fake.base_url, headers=AUTH) as h:
        limited = await h.post("/chat/completions", json={"model": "m", "messages": MSG})
        wrong = await h.post("/chat/completions", json={"model": "m", "messages": MSG},
                             headers={"authorization": "Bearer nope"})
        bad_json = await h.post("/chat/completions", content=b"{", headers={"content-type": "application/json"})
        no_model = await h.post("/chat/completions", json={"messages": MSG})
        bad_role = await h.post("/chat/completions", json={"model": "m", "messages": [{"role": "x"}]})
        bad_tool = await h.post("/chat/completions", json={"model": "m", "messages": MSG, "tools": [{}]})
        nowhere = await h.get("/../../etc/passwd")
    assert limited.status_code == 429
    assert (limited.headers["retry-after"], limited.headers["retry-after-ms"]) == ("2", "1500")
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    for r in (bad_json, no_model, bad_role, bad_tool):
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert nowhere.status_code == 404
    assert fake.saw_api_key(KEY) and fake.saw_api_key("nope")
    assert all(KEY not in json.dumps(r.headers) for r in fake.requests)


@pytest.mark.asyncio
async def test_error_mid_stream_is_a_data_line_without_done(fake):
    fake.enqueue(Reply("one two three four five six seven", chunk_tokens=1, error_after=3))
    chunks, done = await stream_chat(fake)
    assert not done
    assert "error" in chunks[-1]
    assert sum(1 for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")) == 3
    assert fake.last_request.completed


@pytest.mark.asyncio
async def test_thinking_becomes_reasoning_content(fake):
    fake.enqueue(Reply(thinking("step one then step two"), "answer"))
    chunks, _ = await stream_chat(fake)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
    assert reasoning == "step one then step two" and assemble(chunks)[0] == "answer"


@pytest.mark.asyncio
async def test_dropped_connection_mid_stream(fake):
    fake.enqueue(Reply("one two three four", chunk_tokens=1, drop_after=2))
    with pytest.raises(httpx2.TransportError):
        await stream_chat(fake)
    assert fake.last_request.disconnected and not fake.last_request.completed
