"""run.start / run.cancel / conversations.* through the broker's method table, over an in-memory broker
with the real gate, the PermissionRouter and FakeAnthropic."""

from __future__ import annotations

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import InvalidParams, Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply

from .rig import KEY, make_backend

A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb#k1", client_id="kernel:aaa")
A2 = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb#k1", client_id="kernel:aaa2")
B = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb#k2", client_id="kernel:bbb")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me", user="me")

pytestmark = pytest.mark.asyncio


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def broker_with(fake) -> Broker:
    broker = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1"))
    broker.grants.issue(Grant(origin=A.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    install_runtime(broker, {"anthropic": make_backend("anthropic", fake)})
    return broker


async def finished(broker: Broker, run_id: str) -> str:
    await broker.runs.wait(run_id)
    return [e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS][0]


async def test_start_run_and_conversations(fake):
    broker = broker_with(fake)
    fake.enqueue(Reply("one"), Reply("two"), Reply("two again"))
    r1 = await call_method(broker, A, "run.start", {"conversation": "cell-chain", "prompt": "first"})
    assert await finished(broker, r1["run_id"]) == EventType.DONE
    r2 = await call_method(broker, A, "run.start", {"conversation": "cell-chain", "prompt": "second"})
    await finished(broker, r2["run_id"])
    listed = await call_method(broker, A, "conversations.list", {})
    assert [c["conv_id"] for c in listed["conversations"]] == ["cell-chain"]
    assert (await call_method(broker, B, "conversations.list", {}))["conversations"] == []
    # re-running the second cell: fork at turn 1 replaces it
    forked = await call_method(broker, A, "conversations.fork", {"conversation": "cell-chain", "at_turn": 1})
    assert forked == {"conversation": "cell-chain", "removed_messages": 2, "turns": 1}
    r3 = await call_method(broker, A, "run.start", {"conversation": "cell-chain", "prompt": "second, edited"})
    await finished(broker, r3["run_id"])
    assert "second" not in str(fake.requests[-1].body["messages"]).replace("second, edited", "")
    with pytest.raises(Refusal) as info:
        await call_method(broker, B, "conversations.delete", {"conversation": "cell-chain"})
    assert info.value.code.value == "NOT_FOUND"
    assert (await call_method(broker, A, "conversations.delete", {"conversation": "cell-chain"}))["deleted"]


async def test_cancel_only_by_originator_or_browser(fake):
    broker = broker_with(fake)
    fake.enqueue(Reply("word " * 2000, tokens_per_second=100, chunk_tokens=1))
    run_id = (await call_method(broker, A, "run.start", {"conversation": "c1", "prompt": "go"}))["run_id"]
    with pytest.raises(Refusal) as info:
        await call_method(broker, A2, "run.cancel", {"run_id": run_id})
    assert info.value.code.value == "NOT_ORIGINATOR"
    with pytest.raises(Refusal) as info:
        await call_method(broker, B, "run.cancel", {"run_id": run_id})
    assert info.value.code.value == "NOT_FOUND"
    # another notebook naming "c1" gets its own conversation (B has no grant here, so its run fails)
    other = await call_method(broker, B, "run.start", {"conversation": "c1", "prompt": "hijack"})
    assert await finished(broker, other["run_id"]) == EventType.ERROR
    with pytest.raises(Refusal) as info:
        await call_method(broker, A, "run.start", {"conversation": "c1", "prompt": "again"})
    assert info.value.code.value == "CONFLICT"
    assert (await call_method(broker, A, "run.cancel", {"run_id": run_id})) == {"cancelled": True}
    assert await finished(broker, run_id) == EventType.CANCELLED
    assert (await call_method(broker, BROWSER, "run.cancel", {"run_id": run_id})) == {"cancelled": False}
    history = broker.runs.conversations.load_conversation(conversation_key(A.origin, "c1"))["messages"]
    assert "hijack" not in str(history) and "go" in str(history)


async def test_bad_params_and_unconfigured_backend(fake):
    broker = broker_with(fake)
    for params in ({"conversation": "c", "prompt": ""}, {"conversation": "../x y", "prompt": "p"},
                   {"conversation": "c", "prompt": "p", "mode": "yolo"}, {"conversation": "c", "prompt": "p", "x": 1},
                   {"conversation": "c", "prompt": "p", "max_tokens": 0}):
        with pytest.raises(InvalidParams):
            await call_method(broker, A, "run.start", params)
    with pytest.raises(Refusal) as info:
        await call_method(broker, A, "run.start", {"conversation": "c", "prompt": "p", "backend": "openai"})
    assert info.value.code.value == "NO_BACKEND"
    with pytest.raises(Refusal) as info:
        await call_method(broker, A, "run.start", {"conversation": "c", "prompt": "p", "model": "gpt-4"})
    assert info.value.code.value == "MODEL_NOT_ALLOWED"
    no_grant = await call_method(broker, B, "run.start", {"conversation": "cb", "prompt": "p"})
    assert await finished(broker, no_grant["run_id"]) == EventType.ERROR
    error = [e for e in broker.store.events_since(0) if e.type == EventType.ERROR][0]
    assert error.data["code"] == "UNAUTHORIZED"


class _ScriptedEngine:
    """A second engine registered in one place (install_runtime's engines): it streams text and proposes one
    tool call through the broker's executor, so the gate, journal and events stay the broker's."""

    name = "claude-code"

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, params) -> None:
        self.checked.append(params.engine)

    async def drive(self, run) -> None:
        from relay_jupyter.backends.base import ToolCallDone
        from relay_jupyter.runtime.tools import ToolIndex

        history = run.begin()
        assert history[-1]["role"] == "user"
        run.step()
        run.text("from the scripted engine")
        index = ToolIndex([], run.tool_ctx)
        result = await run.executor.run_call(run.tool_ctx, index, ToolCallDone(id="c1", name="nope", input={}))
        assert result.is_error and result.code == "UNKNOWN_TOOL"
        run.add({"role": "assistant", "content": [{"type": "text", "text": "from the scripted engine"}]})


async def test_an_engine_registered_in_one_place_is_selected_by_run_start(fake):
    broker = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1"))
    broker.grants.issue(Grant(origin=A.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    engine = _ScriptedEngine()
    install_runtime(broker, {"anthropic": make_backend("anthropic", fake)}, engines={"claude-code": engine})
    run_id = (await call_method(broker, A, "run.start", {"conversation": "e1", "prompt": "hi",
                                                         "engine": "claude-code"}))["run_id"]
    assert await finished(broker, run_id) == EventType.DONE
    types = [e.type for e in broker.store.events_since(0) if e.run_id == run_id]
    assert EventType.TEXT_DELTA in types and EventType.TOOL_DECIDED in types and EventType.STEP in types
    assert engine.checked == ["claude-code"] and fake.requests == []  # the relay loop never ran
    history = broker.runs.conversations.load_conversation(conversation_key(A.origin, "e1"))["messages"]
    assert [m["role"] for m in history] == ["user", "assistant"]
    # the default engine is the relay loop; an unknown engine is refused by the protocol
    fake.enqueue(Reply("relay loop"))
    run_id = (await call_method(broker, A, "run.start", {"conversation": "e2", "prompt": "hi"}))["run_id"]
    assert await finished(broker, run_id) == EventType.DONE and len(fake.requests) == 1
    with pytest.raises(InvalidParams):
        await call_method(broker, A, "run.start", {"conversation": "e3", "prompt": "p", "engine": "bogus"})


async def test_an_engine_that_is_not_enabled_is_refused_in_one_line(fake):
    broker = broker_with(fake)
    broker.runs.engines.pop("claude-code", None)
    with pytest.raises(Refusal) as info:
        await call_method(broker, A, "run.start", {"conversation": "c", "prompt": "p", "engine": "claude-code"})
    assert info.value.code.value == "NO_ENGINE" and "claude-code" in info.value.message
    assert "\n" not in info.value.message
