"""The OpenAI-compatible endpoint (issue 16 item 8) on the plain app the daemon serves, in process: the
official ``openai`` SDK (a client nobody here wrote) against ``relay/openai/v1/...`` and the shipped fake
OpenAI-compatible server as the upstream.

Proves: the gate on every request (no grant, a model outside the grant, a spent budget: the SDK's own
exception types, OpenAI-shaped bodies with the relay code; nothing reaches the upstream); the upstream gets
the broker's key (the fake refuses any other) and none of the client's credentials or relay headers; the
whole request is reserved (messages, tools, ``max_tokens`` x ``n``; an unbounded request is sent with the
bound relay reserved); settling with reported usage, an estimate when a stream reports none (audited
``estimated``), the reservation for an answer that runs far past its ``max_tokens`` — which ends with an
error the SDK raises on; hostile bodies get their documented errors; ``models`` is filtered to the grant.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.openai_proxy import DEFAULT_MAX_OUTPUT
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.server.plain import make_app
from relay_jupyter.testing import FakeOpenAI
from relay_jupyter.testing.script import Reply, Usage, text, tool_use

KEY = "sk-openai-broker-key-0123456789abcdef"
TOKEN = "daemon-token-for-the-test"
MODEL = "gpt-fake-1"


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAI(api_key=KEY, models=(MODEL, "gpt-other-2")) as server:
        yield server


@pytest_asyncio.fixture
async def served(fake):
    broker = Broker.open(BrokerConfig(in_memory=True, openai_base_url=fake.base_url, openai_api_key=KEY))

    def resolve(handler):
        if handler.request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return None
        name = handler.request.headers.get("X-Relay-Client", "default")
        return Caller(kind=CallerKind.DAEMON, origin=f"daemon:{name}", client_id=f"daemon:{name}:1")

    server = make_app(broker, resolve).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, f"http://127.0.0.1:{port}/relay/openai/v1"
    server.stop()
    await server.close_all_connections()
    proxy = server.request_callback.settings.get("relay_openai_proxy") if hasattr(server, "request_callback") else None
    if proxy is not None:
        await proxy.aclose()
    broker.close()


def _grant(broker: Broker, name: str, **budget: Any) -> str:
    origin = f"daemon:{name}"
    broker.grants.issue(Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({MODEL}),
                              budget=Budget(**budget) if budget else Budget(), consent_id="test"))
    return origin


def _client(base: str, name: str, key: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url=base, default_headers={"X-Relay-Client": name}, max_retries=0)


def _model_records(broker: Broker, origin: str) -> list[Any]:
    return [r for r in broker.audit.tail(500, origin=origin) if r.tool == f"model:{MODEL}"]


async def _settled(broker: Broker, origin: str, n: int) -> list[Any]:
    """The origin's first ``n`` settle records, once there (a stream settles after its last byte, when the
    SDK may already have stopped reading at ``[DONE]``)."""
    for _ in range(3000):
        settled = [r for r in _model_records(broker, origin) if r.decision == "settled"]
        if len(settled) >= n:
            return settled
        await asyncio.sleep(0.01)
    return settled


@pytest.mark.asyncio
async def test_refusals_are_openai_shaped_and_nothing_reaches_the_upstream(served, fake) -> None:
    broker, base = served
    before = len(fake.requests)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as auth:
        await _client(base, "x", key="wrong-token").chat.completions.create(model=MODEL, messages=hi)
    assert auth.value.status_code == 401 and auth.value.body["type"] == "authentication_error"

    with pytest.raises(openai.PermissionDeniedError) as denied:  # no grant
        await _client(base, "nogrant").chat.completions.create(model=MODEL, messages=hi)
    assert denied.value.body["code"] == "UNAUTHORIZED" and "[UNAUTHORIZED]" in denied.value.body["message"]
    assert "daemon:nogrant" in denied.value.body["message"]

    _grant(broker, "scoped")
    with pytest.raises(openai.PermissionDeniedError) as scope:  # the upstream serves it; the grant does not
        await _client(base, "scoped").chat.completions.create(model="gpt-other-2", messages=hi)
    assert scope.value.body["code"] == "SCOPE_EXCEEDED"

    _grant(broker, "poor", tokens_per_day=100)
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base, default_headers={"X-Relay-Client": "poor"},
                                max_retries=3)  # the SDK would retry a 429: relay says not to
    with pytest.raises(openai.RateLimitError) as spent:
        await client.chat.completions.create(model=MODEL, messages=hi, max_tokens=500)
    assert spent.value.body["code"] == "BUDGET_EXCEEDED" and spent.value.body["type"] == "insufficient_quota"
    assert spent.value.response.headers.get("x-should-retry") == "false"
    audit = _model_records(broker, "daemon:poor")
    assert [(r.decision, r.code) for r in audit] == [("deny", "BUDGET_EXCEEDED")]
    assert audit[0].arguments["purpose"] == "proxy"
    assert len(fake.requests) == before


@pytest.mark.asyncio
async def test_hostile_bodies_get_their_documented_errors(served, fake) -> None:
    import httpx2

    broker, base = served
    _grant(broker, "hostile")
    before = len(fake.requests)
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Relay-Client": "hostile", "content-type": "application/json"}
    cases = [(b"{not json", 400), (b"[]", 400), (json.dumps({"model": MODEL}).encode(), 400),
             (json.dumps({"model": MODEL, "messages": []}).encode(), 400),
             (json.dumps({"model": MODEL, "messages": ["x"]}).encode(), 400),
             (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).encode(), 400),
             (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 10_000}).encode(), 400),
             (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), 400),
             (json.dumps({"model": 7, "messages": [{"role": "user", "content": "x"}]}).encode(), 400)]
    async with httpx2.AsyncClient() as http:
        for body, status in cases:
            resp = await http.post(base + "/chat/completions", content=body, headers=headers)
            error = resp.json()["error"]
            assert resp.status_code == status and error["type"] == "invalid_request_error", (body, resp.text)
            assert set(error) == {"message", "type", "param", "code"}
        big = await http.post(base + "/chat/completions", content=b"x" * (33 * 1024 * 1024), headers=headers)
        assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
    assert len(fake.requests) == before


@pytest.mark.asyncio
async def test_the_sdk_reaches_the_upstream_through_the_gate(served, fake) -> None:
    broker, base = served
    origin = _grant(broker, "sdk")
    client = _client(base, "sdk")

    # not streamed: the reported usage is charged
    fake.enqueue(Reply(text("Hello from upstream."), usage=Usage(input_tokens=11, output_tokens=5)))
    answer = await client.chat.completions.create(model=MODEL, max_tokens=64,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello from upstream." and answer.usage.prompt_tokens == 11
    seen = fake.requests[-1]
    assert seen.headers.get("authorization") == "[REDACTED]"  # the broker's key: the fake refuses any other
    assert not {"x-relay-client", "cookie", "x-api-key"} & set(seen.headers)
    assert seen.body["max_tokens"] == 64 and "stream_options" not in seen.body  # forwarded as sent

    # streamed with usage asked for: reported; without: an estimate, audited as one
    fake.enqueue(Reply(text("streamed words arrive one by one"), usage=Usage(input_tokens=7, output_tokens=6)))
    stream = await client.chat.completions.create(model=MODEL, max_tokens=64, stream=True,
                                                  stream_options={"include_usage": True},
                                                  messages=[{"role": "user", "content": "go"}])
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "streamed words arrive one by one"
    assert chunks[-1].usage.completion_tokens == 6

    fake.stream_usage = False  # as llama.cpp streams: no usage even when asked
    try:
        fake.enqueue(Reply(text("no usage comes with this answer"), tool_use("add", {"a": 1, "b": 2})))
        stream = await client.chat.completions.create(
            model=MODEL, max_tokens=64, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "go"}],
            tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])
        chunks = [c async for c in stream]
    finally:
        fake.stream_usage = True
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)

    settled = await _settled(broker, origin, 3)
    assert [r.arguments["basis"] for r in settled] == ["reported", "reported", "estimated"], settled
    assert [r.arguments["tokens"] for r in settled[:2]] == [16, 13]
    allows = [r for r in _model_records(broker, origin) if r.decision == "allow"]
    assert settled[2].arguments["tokens"] > allows[2].arguments["estimated_input_tokens"]  # output estimated too
    assert allows[2].arguments["estimated_input_tokens"] > allows[1].arguments["estimated_input_tokens"]  # tools
    usage = broker.ledger.usage(origin)
    assert usage["tokens"] == 16 + 13 + settled[2].arguments["tokens"] and usage["reserved_tokens"] == 0

    # models: the upstream's list, filtered to the grant
    assert [m.id async for m in client.models.list()] == [MODEL]


@pytest.mark.asyncio
async def test_the_reservation_bounds_the_answer(served, fake) -> None:
    broker, base = served
    origin = _grant(broker, "bounds")
    client = _client(base, "bounds")

    # no max_tokens: sent with the bound relay reserved; n choices reserve n answers
    fake.enqueue(Reply(text("bounded")), Reply(text("two")))
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert fake.requests[-1].body["max_tokens"] == DEFAULT_MAX_OUTPUT
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=10, n=3)
    assert "max_tokens" in fake.requests[-1].body and fake.requests[-1].body["n"] == 3
    allows = [r for r in _model_records(broker, origin) if r.decision == "allow"]
    assert [r.arguments["max_output_tokens"] for r in allows] == [DEFAULT_MAX_OUTPUT, 30]

    # a server that ignores max_tokens: the answer is cut far past the bound, with an error the SDK raises on
    fake.enqueue(Reply(text("word " * 2000), usage=Usage(input_tokens=5, output_tokens=2000)))
    stream = await client.chat.completions.create(model=MODEL, max_tokens=4, stream=True,
                                                  messages=[{"role": "user", "content": "x"}])
    got = []
    with pytest.raises(openai.APIError) as cut:
        async for chunk in stream:
            got.append(chunk)
    assert "[BUDGET_EXCEEDED]" in str(cut.value) and cut.value.body["code"] == "BUDGET_EXCEEDED"
    assert got  # the words before the cut were delivered
    await _settled(broker, origin, 3)
    last_allow, last = [r for r in _model_records(broker, origin) if r.decision in ("allow", "settled")][-2:]
    assert last.decision == "settled" and last.arguments["basis"] == "reservation"
    assert last.arguments["tokens"] == last_allow.arguments["estimated_tokens"]
    assert broker.ledger.usage(origin)["reserved_tokens"] == 0


@pytest.mark.asyncio
async def test_the_anthropic_endpoint_cuts_an_answer_past_its_max_tokens_too() -> None:
    """One metering path for both wires: a Messages stream that runs far past ``max_tokens`` ends with an
    ``error`` event the ``anthropic`` SDK raises on, and is charged its reservation."""
    import anthropic

    from relay_jupyter.testing import FakeAnthropic

    with FakeAnthropic(api_key=KEY, models=("claude-test-1",)) as upstream:
        broker = Broker.open(BrokerConfig(in_memory=True, anthropic_api_key=KEY, anthropic_base_url=upstream.base_url))
        server = make_app(broker, lambda h: Caller(kind=CallerKind.DAEMON, origin="daemon:a", client_id="daemon:a:1")
                          ).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        try:
            broker.grants.issue(Grant(origin="daemon:a", models=frozenset({"claude-test-1"}), consent_id="test"))
            client = anthropic.AsyncAnthropic(api_key="x", base_url=f"http://127.0.0.1:{port}/relay/anthropic",
                                              max_retries=0)
            upstream.enqueue(Reply(text("word " * 2000)))
            stream = await client.messages.create(model="claude-test-1", max_tokens=4, stream=True,
                                                  messages=[{"role": "user", "content": "x"}])
            with pytest.raises(anthropic.APIStatusError) as cut:
                async for _ in stream:
                    pass
            assert "[BUDGET_EXCEEDED]" in str(cut.value)
            allow, settled = [r for r in broker.audit.tail(50, origin="daemon:a") if r.tool == "model:claude-test-1"]
            assert settled.arguments["basis"] == "reservation"
            assert settled.arguments["tokens"] == allow.arguments["estimated_tokens"]
        finally:
            server.stop()
            await server.close_all_connections()
            await server.request_callback.settings["relay_anthropic_proxy"].aclose()
            broker.close()
