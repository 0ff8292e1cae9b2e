"""Each backend against the shipped FaultModelServer: honest codes, bounded memory, no truncated answer
taken for a complete one. (The same faults through the whole runtime: tests/runtime/test_backend_faults.py.)"""

from __future__ import annotations

import tracemalloc

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import BackendFailure, Progress, RetryPolicy, Stop, TextDelta, ToolCallDone
from relay_jupyter.backends.openai import OpenAIBackend
from relay_jupyter.core.errors import Code
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, FaultModelServer

KEY = "sk-test-faults-0123456789"
MSGS = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_total_wait=2.0)

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["anthropic", "openai"])
def kind(request):
    return request.param


def backend_for(kind, server, **kw):
    if kind == "anthropic":
        return AnthropicBackend(KEY, base_url=server.base_url, retry=FAST, **kw)
    return OpenAIBackend(server.base_url, KEY, retry=FAST, **kw)


async def collect(backend):
    seen = []
    try:
        async for event in backend.stream_turn("m-1", "", MSGS, [], 100):
            seen.append(event)
    except BackendFailure as exc:
        return seen, exc
    return seen, None


async def test_oversized_line_memory_is_bounded(kind):
    # a 64 MB SSE line with no newline: refused at the 1 MiB cap while it is read, never buffered whole
    with FaultModelServer("oversized", api_key=KEY, oversize_bytes=64 * 1024 * 1024) as server:
        backend = backend_for(kind, server)
        tracemalloc.start()
        try:
            seen, exc = await collect(backend)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await backend.aclose()
    assert exc is not None and exc.code is Code.BACKEND_ERROR and "larger than 1048576 bytes" in exc.message
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == server.text
    assert peak < 8 * 1024 * 1024, peak  # the line was 64 MB; the old readers held all of it (or +100 MB)
    assert server.oversize_sent < server.oversize_bytes


async def test_a_smaller_cap_is_honoured(kind):
    with FaultModelServer("ok", api_key=KEY, text="word " * 200) as server:
        backend = backend_for(kind, server, max_event_bytes=256)  # every event here is under 256 bytes
        seen, exc = await collect(backend)
        assert exc is None and isinstance(seen[-1], Stop)
        server.text = "x" * 1000  # one delta of 1000 characters: one event over the cap
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is not None and "larger than 256 bytes" in exc.message


async def test_silent_server_is_a_timeout(kind):
    with FaultModelServer("stall_silent", api_key=KEY, max_seconds=5) as server:
        backend = backend_for(kind, server, timeout=0.3)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is not None and exc.code is Code.BACKEND_TIMEOUT, exc
    assert "sent nothing" in exc.message and "turn_timeout" in exc.message  # what to do
    assert any(isinstance(e, TextDelta) for e in seen)


async def test_pings_keep_the_transport_alive_but_emit_nothing(kind):
    # keep-alives are not content: no event reaches the driver, so they cannot reset its idle deadline
    with FaultModelServer("stall_pings", api_key=KEY, interval=0.02, max_seconds=0.4) as server:
        backend = backend_for(kind, server, timeout=5)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert [type(e).__name__ for e in seen if not isinstance(e, Progress)].count("TextDelta") == 1
    assert not any(isinstance(e, Progress) for e in seen)
    assert exc is not None and "closed the stream before the answer ended" in exc.message  # then it ended


async def test_truncation_yields_no_stop_and_no_open_tool_call(kind):
    with FaultModelServer("truncate", api_key=KEY) as server:
        backend = backend_for(kind, server)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is not None and exc.code is Code.BACKEND_ERROR
    assert exc.message.startswith("the model server closed the stream before the answer ended")
    assert not any(isinstance(e, (Stop, ToolCallDone)) for e in seen)


async def test_cut_and_unreachable_are_unreachable(kind):
    with FaultModelServer("cut", api_key=KEY) as server:
        backend = backend_for(kind, server)
        _, exc = await collect(backend)
        await backend.aclose()
        base = server.base_url
    assert exc.code is Code.BACKEND_UNREACHABLE and "was cut" in exc.message

    class Gone:
        base_url = base

    dead = backend_for(kind, Gone())
    _, exc = await collect(dead)
    await dead.aclose()
    assert exc.code is Code.BACKEND_UNREACHABLE and exc.message.startswith("cannot reach")


async def test_mid_stream_error_is_the_servers_own_and_not_retried(kind):
    with FaultModelServer("error_event", api_key=KEY, error_type="overloaded_error",
                          error_message=f"Overloaded; your key {KEY} is fine") as server:
        backend = backend_for(kind, server)
        _, exc = await collect(backend)
        await backend.aclose()
        assert len(server.requests) == 1
    assert exc.code is Code.BACKEND_ERROR and "failed mid-stream (overloaded_error: Overloaded;" in exc.message
    assert "HTTP 200" not in exc.message and KEY not in exc.message and "[redacted]" in exc.message
    assert exc.data.get("error_type") == "overloaded_error"


async def test_http_error_reports_the_servers_message(kind):
    cls = FakeAnthropic if kind == "anthropic" else FakeOpenAI
    with cls(api_key=KEY) as fake:
        fake.enqueue_error(400, body={"error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}
                           if kind == "openai" else {"type": "error", "error": {"type": "invalid_request_error",
                                                                                 "message": "max_tokens: too big"}})
        backend = backend_for(kind, fake)
        _, exc = await collect(backend)
        await backend.aclose()
    assert exc.code is Code.BACKEND_ERROR and exc.status == 400
    assert "HTTP 400 (invalid_request_error: max_tokens: too big)" in exc.message


@pytest.mark.parametrize("fault", ["malformed_json", "malformed_sse"])
async def test_malformed_streams(kind, fault):
    with FaultModelServer(fault, api_key=KEY) as server:
        backend = backend_for(kind, server)
        _, exc = await collect(backend)
        await backend.aclose()
    assert exc.code is Code.BACKEND_ERROR and "malformed" in exc.message


@pytest.mark.parametrize(("fault", "expected"), [("huge_usage", 10**12), ("negative_usage", -500), ("no_usage", None)])
async def test_usage_faults_are_served(kind, fault, expected):
    # the budget rules that consume these live in the gate; here: the fault server really sends them
    with FaultModelServer(fault, api_key=KEY) as server:
        backend = backend_for(kind, server)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is None and isinstance(seen[-1], Stop)
    outputs = [e.usage.output_tokens for e in seen if type(e).__name__ == "UsageEvent"]
    if expected is None:
        assert all(o == 0 for o in outputs)
    else:
        assert outputs[-1] == expected


async def test_unknown_fault_is_refused():
    with pytest.raises(ValueError):
        FaultModelServer("explode")


async def test_anthropic_message_stop_with_an_open_tool_block_is_an_error():
    from relay_jupyter.testing.fault_model_server import _Anthropic

    class OpenThenStop(FaultModelServer):
        async def _play(self, wire, responder):
            assert isinstance(wire, _Anthropic)
            await wire.start(usage=True)
            await wire.text("calling")
            await wire.open_tool_call()
            await wire.emit("message_stop", {"type": "message_stop"})
            await responder.end()

    with OpenThenStop(api_key=KEY) as server:
        backend = backend_for("anthropic", server)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is not None and "tool call still open" in exc.message
    assert not any(isinstance(e, ToolCallDone) for e in seen)


async def test_a_loopback_model_server_is_never_reached_through_a_proxy(kind, monkeypatch):
    # a proxy in the environment would see the key of a request meant for this machine
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: a proxied request would fail
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with FaultModelServer("ok", api_key=KEY) as server:
        backend = backend_for(kind, server)
        seen, exc = await collect(backend)
        await backend.aclose()
    assert exc is None and isinstance(seen[-1], Stop) and len(server.requests) == 1


async def test_a_wrong_key_says_to_check_the_key(kind):
    cls = FakeAnthropic if kind == "anthropic" else FakeOpenAI
    with cls(api_key="the-right-key-0123456789") as fake:
        backend = backend_for(kind, fake)
        _, exc = await collect(backend)
        await backend.aclose()
    assert exc.code is Code.BACKEND_ERROR and exc.status == 401 and len(fake.requests) == 1  # not retried
    assert "HTTP 401" in exc.message and exc.message.endswith("Check the API key in the relay server config "
                                                               "(its secrets file or the server's environment).")
    assert KEY not in exc.message and "the-right-key" not in exc.message
