"""RPC handlers' store calls run on a store thread, not the event loop (issues 12 and 18; docs/runtime.md
"What runs off the loop"): while one request's store call is stuck (a PostgreSQL row lock, a SQLite write
lock of another process), the broker still answers other requests.

Each case makes one store method block (until released, or a 20 s bound so the code before this change
fails instead of hanging), sends the request that calls it, and, while that call is in flight, sends
another request: it must be answered before the stuck call returns. Real broker, real runtime, the
real Anthropic backend against the shipped fake server. Nothing here asserts on time.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.runs import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS
from relay_jupyter.testing import FakeAnthropic, Reply

KEY = "sk-test-rpc-off-loop-0123456789"
NB = "notebook:a.ipynb"
KERNEL = Caller(kind=CallerKind.KERNEL, origin=NB, client_id="kernel:k1")
OTHER = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:k2")
BOUND = 20.0  # the stuck call gives up after this long: only the code before this change waits for it

pytestmark = pytest.mark.asyncio


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


@pytest.fixture
def broker(fake):
    b = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1"))
    for origin in (NB, OTHER.origin):
        b.grants.issue(Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    retry = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.1, max_total_wait=0.1)
    install_runtime(b, {"anthropic": AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",),
                                                      retry=retry, timeout=30)})
    yield b
    b.close()


class Stuck:
    """Makes ``owner.name`` block once it is called, until :meth:`release` (or :data:`BOUND`)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.entered, self.released, self.returned = threading.Event(), threading.Event(), threading.Event()
        original = getattr(owner, name)

        def stuck(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            self.released.wait(BOUND)
            try:
                return original(*args, **kwargs)
            finally:
                self.returned.set()

        setattr(owner, name, stuck)

    def release(self) -> None:
        self.released.set()


async def _rpc(broker: Broker, caller: Caller, method: str, params: dict[str, Any]) -> dict[str, Any]:
    raw = await broker.dispatch(caller, json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                                                    "params": params}).encode())
    return json.loads(raw)


async def _served_while_stuck(broker: Broker, stuck: Stuck, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send ``method``; once its store call is stuck, another client's request must be answered before the
    stuck call returns. Returns the first request's response."""
    first = asyncio.create_task(_rpc(broker, KERNEL, method, params))
    while not stuck.entered.is_set():  # the code before: the loop is inside the stuck call until it returns
        await asyncio.sleep(0.005)
    other = await _rpc(broker, OTHER, "grants.get", {})
    answered_while_stuck = not stuck.returned.is_set()
    stuck.release()
    response = await first
    assert "result" in other and other["result"]["grant"]["origin"] == OTHER.origin
    assert answered_while_stuck, f"{method}: the broker answered nothing while its store call waited"
    return response


def _conversation(broker: Broker, name: str) -> str:
    from relay_jupyter.broker.conversation_keys import conversation_key

    key = conversation_key(NB, name)
    broker.runs.conversations.save_conversation(key, NB, name, [
        {"role": "user", "content": [{"type": "text", "text": "first"}], "turn": 0},
        {"role": "assistant", "content": [{"type": "text", "text": "answer"}], "turn": 0}], {})
    return key


@pytest.mark.parametrize("method", ["conversations.list", "conversations.fork", "conversations.delete"])
async def test_conversation_methods(broker, method):
    _conversation(broker, "c1")
    stuck = Stuck(broker.runs.conversations, "list_conversations" if method == "conversations.list"
                  else "load_conversation")
    params = {} if method == "conversations.list" else {"conversation": "c1"}
    if method == "conversations.fork":
        params["at_turn"] = 0
    response = await _served_while_stuck(broker, stuck, method, params)
    assert "result" in response, response
    if method == "conversations.list":
        assert [c["conv_id"] for c in response["result"]["conversations"]] == ["c1"]
    elif method == "conversations.fork":
        assert response["result"]["removed_messages"] == 2
    else:
        assert response["result"]["deleted"] is True


async def test_a_run_start_while_a_fork_holds_the_conversation_is_conflict(broker, fake):
    """The fork's load and rewrite are on a store thread: meanwhile the conversation is claimed, so a run
    cannot load the history the fork is rewriting (CONFLICT, as with a running agent)."""
    _conversation(broker, "c1")
    stuck = Stuck(broker.runs.conversations, "load_conversation")
    fork = asyncio.create_task(_rpc(broker, KERNEL, "conversations.fork", {"conversation": "c1", "at_turn": 0}))
    while not stuck.entered.is_set():
        await asyncio.sleep(0.005)
    refused = await _rpc(broker, KERNEL, "run.start", {"conversation": "c1", "prompt": "go"})
    stuck.release()
    assert "result" in await fork
    assert refused["error"]["data"]["code"] == "CONFLICT", refused


@pytest.mark.parametrize("method,store,name", [("runs.list", "store", "list_runs"),
                                               ("runs.get", "store", "get_run"),
                                               ("budget.get", "ledger", "usage")])
async def test_journal_and_budget_reads(broker, method, store, name):
    owner = broker.ledger if store == "ledger" else broker.store
    stuck = Stuck(owner, name)
    params = {"run_id": "run_missing"} if method == "runs.get" else {}
    response = await _served_while_stuck(broker, stuck, method, params)
    if method == "runs.get":
        assert response["error"]["data"]["code"] == "NOT_FOUND"
    else:
        assert "result" in response, response


@pytest.mark.parametrize("name", ["load_conversation", "run_started"])
async def test_run_start(broker, fake, name):
    """run.start's one store call (the history, the owner check, the journal row): stuck, the broker answers."""
    fake.enqueue(Reply("hello there"))
    stuck = Stuck(broker.runs.conversations if name == "load_conversation" else broker.runs.journal, name)
    response = await _served_while_stuck(broker, stuck, "run.start", {"conversation": "c2", "prompt": "go"})
    run_id = response["result"]["run_id"]
    await broker.runs.wait(run_id)
    events = [e.type for e in broker.store.events_since(0) if e.run_id == run_id]
    terminal = [t for t in events if t in TERMINAL_EVENTS]
    assert terminal == ["run.done"], events
