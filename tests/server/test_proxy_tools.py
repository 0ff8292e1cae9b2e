"""The optional tool policy of the model endpoints (issue 16 item 3): a grant's ``proxy_tools`` names the tools
an answer relayed to its origin may call. The official SDKs against the daemon's plain app in process and the
shipped fake upstreams; both wires, streamed and not.

Proves: off by default (a tool call passes unchanged); with a policy, a ``tool_use`` block / ``tool_calls``
entry for another tool never reaches the client — not its name in a tool call, not a byte of its arguments —
and is replaced by a text saying relay refused it, audited as a ``deny``; an allowed tool passes beside it;
when every call was refused the answer ends as a plain answer (``end_turn`` / ``stop``), so the agent does
not wait for tool results; the streams stay well-formed for the SDKs' own accumulators; a call whose first
piece names no tool is refused (fail closed); a grant cannot widen the policy without a fresh consent.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.proxy_tools import OpenAIToolFilter, ToolPolicy
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import GateRefusal
from relay_jupyter.core.types import Grant
from relay_jupyter.server.plain import make_app
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI
from relay_jupyter.testing.script import Reply, text, tool_use

KEY = "sk-test-upstream-key-0123456789abcdef"
SECRET_ARG = "rm -rf /home/alice"
CLAUDE, GPT = "claude-test-1", "gpt-fake-1"


@pytest_asyncio.fixture
async def served():
    with FakeAnthropic(api_key=KEY, models=(CLAUDE,)) as fa, FakeOpenAI(api_key=KEY, models=(GPT,)) as fo:
        broker = Broker.open(BrokerConfig(in_memory=True, anthropic_api_key=KEY, anthropic_base_url=fa.base_url,
                                          openai_base_url=fo.base_url, openai_api_key=KEY))

        def resolve(handler):
            name = handler.request.headers.get("X-Relay-Client", "default")
            return Caller(kind=CallerKind.DAEMON, origin=f"daemon:{name}", client_id=f"daemon:{name}:1")

        server = make_app(broker, resolve).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        yield broker, f"http://127.0.0.1:{port}/relay/", fa, fo
        server.stop()
        await server.close_all_connections()
        for name in ("relay_anthropic_proxy", "relay_openai_proxy"):
            proxy = server.request_callback.settings.get(name)
            if proxy is not None:
                await proxy.aclose()
        broker.close()


def _grant(broker: Broker, name: str, proxy_tools: set[str] | None) -> str:
    origin = f"daemon:{name}"
    broker.grants.issue(Grant(origin=origin, models=frozenset({CLAUDE, GPT}), consent_id=f"c-{name}",
                              proxy_tools=None if proxy_tools is None else frozenset(proxy_tools)))
    return origin


def _refusals(broker: Broker, origin: str) -> list[Any]:
    return [r for r in broker.audit.tail(200, origin=origin) if r.arguments.get("purpose") == "proxy_tool"]


def _reply() -> Reply:
    return Reply(text("Running both."), tool_use("shell", {"cmd": SECRET_ARG}, id="toolu_shell"),
                 tool_use("add", {"a": 1, "b": 2}, id="toolu_add"))


def _claude(base: str, name: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="x", base_url=base + "anthropic", default_headers={"X-Relay-Client": name},
                                    max_retries=0)


def _gpt(base: str, name: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="x", base_url=base + "openai/v1", default_headers={"X-Relay-Client": name},
                              max_retries=0)


HI = [{"role": "user", "content": "go"}]


@pytest.mark.asyncio
async def test_off_by_default_a_tool_call_passes_unchanged(served) -> None:
    broker, base, fa, fo = served
    origin = _grant(broker, "open", None)
    fa.enqueue(_reply())
    message = await _claude(base, "open").messages.create(model=CLAUDE, max_tokens=256, messages=HI)
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[1].input == {"cmd": SECRET_ARG}
    assert _refusals(broker, origin) == []


@pytest.mark.asyncio
async def test_anthropic_answers_carry_only_granted_tools(served) -> None:
    broker, base, fa, fo = served
    origin = _grant(broker, "claude", {"add"})
    client = _claude(base, "claude")

    fa.enqueue(_reply())
    message = await client.messages.create(model=CLAUDE, max_tokens=256, messages=HI)
    assert [b.type for b in message.content] == ["text", "text", "tool_use"]
    assert "relay refused" in message.content[1].text and "'shell'" in message.content[1].text
    assert message.content[2].name == "add" and message.stop_reason == "tool_use"  # add still runs
    assert SECRET_ARG not in message.model_dump_json()

    fa.enqueue(_reply())
    async with client.messages.stream(model=CLAUDE, max_tokens=256, messages=HI) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "text", "tool_use"]
    assert "relay refused" in final.content[1].text and final.content[2].input == {"a": 1, "b": 2}

    # only refused tools: the answer ends as a plain one, and not one byte of the arguments streams
    fa.enqueue(Reply(tool_use("shell", {"cmd": SECRET_ARG})))
    async with httpx2.AsyncClient() as http:
        resp = await http.post(base + "anthropic/v1/messages", headers={"X-Relay-Client": "claude"},
                               json={"model": CLAUDE, "max_tokens": 256, "messages": HI, "stream": True})
    raw = resp.text
    assert SECRET_ARG not in raw and "tool_use\"" not in raw.replace('"stop_reason": "tool_use"', "")
    assert '"stop_reason": "end_turn"' in raw and "relay refused" in raw
    assert [r.tool for r in _refusals(broker, origin)] == ["shell", "shell", "shell"]
    assert {(r.decision, r.code) for r in _refusals(broker, origin)} == {("deny", "SCOPE_EXCEEDED")}


@pytest.mark.asyncio
async def test_openai_answers_carry_only_granted_tools(served) -> None:
    broker, base, fa, fo = served
    origin = _grant(broker, "gpt", {"add"})
    client = _gpt(base, "gpt")

    fo.enqueue(_reply())
    answer = await client.chat.completions.create(model=GPT, max_tokens=256, messages=HI)
    choice = answer.choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]
    assert "relay refused" in choice.message.content and choice.finish_reason == "tool_calls"
    assert SECRET_ARG not in answer.model_dump_json()

    fo.enqueue(_reply())
    stream = await client.chat.completions.create(model=GPT, max_tokens=256, messages=HI, stream=True)
    chunks = [c async for c in stream]
    names = [tc.function.name for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
             if tc.function and tc.function.name]
    assert names == ["add"]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "relay refused" in content and SECRET_ARG not in "".join(c.model_dump_json() for c in chunks)

    fo.enqueue(Reply(tool_use("shell", {"cmd": SECRET_ARG})))
    stream = await client.chat.completions.create(model=GPT, max_tokens=256, messages=HI, stream=True)
    chunks = [c async for c in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert [r.tool for r in _refusals(broker, origin)] == ["shell", "shell", "shell"]


def test_a_tool_call_that_names_no_tool_is_refused() -> None:
    refused: list[str] = []
    policy = ToolPolicy(frozenset({"add"}), lambda name, call_id: refused.append(name))
    flt = OpenAIToolFilter(policy)
    first = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x'}}]}}]}
    later = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "add",
                                                                                      "arguments": '": 1}'}}]}}]}
    (out,) = flt.event(first)
    assert "tool_calls" not in out["choices"][0]["delta"] and "relay refused" in out["choices"][0]["delta"]["content"]
    (out,) = flt.event(later)  # naming a granted tool later does not bring the call back
    assert "tool_calls" not in out["choices"][0]["delta"]
    assert refused == ["(no name)"]


def test_a_grant_cannot_widen_its_tool_policy_without_a_fresh_consent() -> None:
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        _grant(broker, "narrow", {"add"})
        for wider in ({"add", "shell"}, None, {"*"}):
            with pytest.raises(GateRefusal) as err:
                broker.grants.issue(Grant(origin="daemon:narrow", models=frozenset({CLAUDE, GPT}), consent_id="c-narrow",
                                          proxy_tools=None if wider is None else frozenset(wider)))
            assert "proxy_tools" in err.value.message
        broker.grants.issue(Grant(origin="daemon:narrow", models=frozenset({CLAUDE, GPT}), consent_id="c-narrow",
                                  proxy_tools=frozenset()))  # narrower: fine
        assert broker.grants.get("daemon:narrow").proxy_tools == frozenset()
        assert json.loads(broker.grants.get("daemon:narrow").model_dump_json())["proxy_tools"] == []
    finally:
        broker.close()
