"""The two backends against the fake servers: events, tool assembly, usage, retries, allowlists."""

from __future__ import annotations

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import BackendFailure, RetryPolicy, Stop, TextDelta, ToolCallDone, UsageEvent
from relay_jupyter.backends.openai import OpenAIBackend, chat_url, to_openai_messages
from relay_jupyter.core.types import ToolSpec
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply, Usage, text, tool_use

KEY = "sk-test-backend-0123456789"
TOOLS = [ToolSpec(name="echo", input_schema={"type": "object", "properties": {"text": {"type": "string"}}})]
MSGS = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_total_wait=2.0)


async def collect(backend, model):
    return [e async for e in backend.stream_turn(model, "sys", MSGS, TOOLS, 200)]


@pytest.mark.asyncio
async def test_anthropic_turn_with_tool_and_cache_usage():
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue(Reply(text("Checking the note now."), tool_use("echo", {"text": "hé \"q\" \\ ok"}, id="tu1"),
                           usage=Usage(input_tokens=10, output_tokens=7, cache_creation_input_tokens=3,
                                       cache_read_input_tokens=5)))
        backend = AnthropicBackend(KEY, base_url=fake.base_url, retry=FAST)
        events = await collect(backend, "claude-x")
        body = fake.requests[0].body
        await backend.aclose()
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Checking the note now."
    (call,) = [e for e in events if isinstance(e, ToolCallDone)]
    assert (call.id, call.name, call.input) == ("tu1", "echo", {"text": "hé \"q\" \\ ok"})
    usage = [e for e in events if isinstance(e, UsageEvent)][-1].usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_creation_input_tokens,
            usage.cache_read_input_tokens) == (10, 7, 3, 5)
    assert events[-1] == Stop("tool_use")
    assert body["system"] == "sys" and body["tools"][0]["name"] == "echo"
    assert KEY not in repr(backend)


@pytest.mark.asyncio
async def test_anthropic_retries_529_then_fails_clearly():
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue_error(529, retry_after=0.01)
        fake.enqueue(Reply("fine"))
        backend = AnthropicBackend(KEY, base_url=fake.base_url, retry=FAST)
        events = await collect(backend, "claude-x")
        assert [r.status for r in fake.requests] == [529, 200]
        assert events[-1] == Stop("end_turn")
        fake.enqueue_error(401)
        with pytest.raises(BackendFailure) as info:
            await collect(backend, "claude-x")
        assert info.value.status == 401 and len(fake.requests) == 3  # no retry of a 401
        fake.enqueue_error(429, retry_after=120)
        with pytest.raises(BackendFailure) as info:
            await collect(backend, "claude-x")
        assert "retry after" in info.value.message  # too long to wait inside a run
        await backend.aclose()


@pytest.mark.asyncio
async def test_anthropic_error_mid_stream_is_not_retried():
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue(Reply(text("partial answer that breaks"), error_after=1))
        backend = AnthropicBackend(KEY, base_url=fake.base_url, retry=FAST)
        seen = []
        with pytest.raises(BackendFailure):
            async for e in backend.stream_turn("claude-x", "", MSGS, [], 100):
                seen.append(e)
        assert len(fake.requests) == 1
        await backend.aclose()


def test_model_allowlist():
    backend = AnthropicBackend(KEY, models=("claude-sonnet-*", "claude-haiku-4"))
    assert backend.allows_model("claude-sonnet-4-5") and backend.allows_model("claude-haiku-4")
    assert not backend.allows_model("claude-opus-4") and not backend.allows_model("gpt-4")


@pytest.mark.asyncio
async def test_openai_turn_assembles_tool_calls_by_index():
    with FakeOpenAI(api_key=KEY) as fake:
        fake.enqueue(Reply(text("Two calls."), tool_use("echo", {"text": "one"}, id="c1"),
                           tool_use("echo", {"text": "two"}, id="c2")))
        backend = OpenAIBackend(fake.base_url, KEY, retry=FAST)
        events = await collect(backend, "gpt-fake-1")
        body = fake.requests[0].body
        await backend.aclose()
    calls = [e for e in events if isinstance(e, ToolCallDone)]
    assert [(c.id, c.input) for c in calls] == [("c1", {"text": "one"}), ("c2", {"text": "two"})]
    assert events[-1] == Stop("tool_use")
    assert any(isinstance(e, UsageEvent) and e.usage.output_tokens > 0 for e in events)
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert body["tools"][0]["function"]["name"] == "echo" and body["stream"] is True


@pytest.mark.asyncio
async def test_openai_http_errors_and_unreachable():
    with FakeOpenAI(api_key=KEY) as fake:
        backend = OpenAIBackend(fake.base_url, "wrong-key", retry=FAST)
        with pytest.raises(BackendFailure) as info:
            await collect(backend, "gpt-fake-1")
        assert info.value.status == 401 and "wrong-key" not in str(info.value)
        await backend.aclose()
    dead = OpenAIBackend("http://127.0.0.1:9", KEY, retry=FAST, timeout=2)
    with pytest.raises(BackendFailure) as info:
        await collect(dead, "m")
    assert "cannot reach" in info.value.message
    await dead.aclose()


def test_chat_url_for_local_servers():
    assert chat_url("http://127.0.0.1:11434") == "http://127.0.0.1:11434/v1/chat/completions"  # Ollama
    assert chat_url("http://127.0.0.1:1234/v1/") == "http://127.0.0.1:1234/v1/chat/completions"  # LM Studio
    assert chat_url("http://h:8000/v1/chat/completions") == "http://h:8000/v1/chat/completions"


def test_to_openai_messages_answers_calls_in_order():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r",
                                          "is_error": True}, {"type": "text", "text": "more"}]}]
    out = to_openai_messages("", msgs)
    assert out[1]["tool_calls"][0]["function"] == {"name": "t", "arguments": '{"x": 1}'}
    assert out[2] == {"role": "tool", "tool_call_id": "a", "content": "ERROR: r"}
    assert out[3] == {"role": "user", "content": "more"}
