"""Group commit of event appends (issue 18): ``EventBus.append_soon`` stores every event queued during one
turn of the event loop in one transaction, then delivers them; order is kept against every other append,
a failed commit delivers nothing and reports to each queued event's callback. Over the real SQLite store
(and memory, where the semantics are the same)."""

from __future__ import annotations

import asyncio

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.events import EventBus
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.storage.errors import StoreError
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply

pytestmark = pytest.mark.asyncio

K = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:k")
KEY = "sk-ant-test-group-commit-0123456789"


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = Store.open(tmp_path / "relay.db") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


def _ids(sub) -> list[int]:
    return [i for i, _ in sub.drain()]


async def test_a_burst_is_one_transaction_delivered_after_it_is_stored(store):
    bus = EventBus(store)
    sub = bus.subscribe(K, maxsize=1000)
    failures: list[Exception] = []
    for n in range(20):
        bus.append_soon(EventType.TEXT_DELTA, {"n": n}, origin=K.origin, run_id="r", on_error=failures.append)
    assert store.last_event_id() == 0 and sub.pending == 0  # nothing stored, nothing delivered yet
    await asyncio.sleep(0)  # one turn of the loop: the flush
    assert bus.group_commits == 1 and store.last_event_id() == 20
    assert _ids(sub) == list(range(1, 21)) and [e.data["n"] for e in store.events_since(0)] == list(range(20))
    assert failures == []


async def test_every_other_append_and_a_replay_flush_the_queue_first(store):
    bus = EventBus(store)
    sub = bus.subscribe(K, maxsize=1000)
    bus.append_soon(EventType.TEXT_DELTA, {"n": 1}, origin=K.origin, run_id="r", on_error=print)
    bus.append(EventType.USAGE, {"n": 2}, origin=K.origin, run_id="r")  # after the queued delta, in order
    bus.append_soon(EventType.TEXT_DELTA, {"n": 3}, origin=K.origin, run_id="r", on_error=print)
    _, frames, _ = bus.replay_frames(K, 0, limit=100)  # a replay sees what was queued
    assert frames.count(b"\nevent: ") == 3
    bus.append_soon(EventType.TEXT_DELTA, {"n": 4}, origin=K.origin, run_id="r", on_error=print)
    bus.publish_unstored(EventType.ERROR, {"n": 5}, K.origin, "r")  # live-only: after the queued delta too
    assert [e.data["n"] for e in store.events_since(0)] == [1, 2, 3, 4]
    assert _ids(sub) == [1, 2, 3, 4, None]  # delivered once each, in order; the unstored one has no id
    await asyncio.sleep(0)
    assert _ids(sub) == [] and store.last_event_id() == 4


async def test_a_failed_commit_delivers_nothing_and_tells_each_queued_event(tmp_path):
    with Store.open(tmp_path / "relay.db") as store:
        bus = EventBus(store)
        sub = bus.subscribe(K, maxsize=1000)
        failed: list[tuple[str, Exception]] = []
        store._conn.execute("PRAGMA query_only = ON")  # a real failed write (SQLITE_READONLY)
        for run in ("a", "b", "a"):
            bus.append_soon(EventType.TEXT_DELTA, {"x": 1}, origin=K.origin, run_id=run,
                            on_error=(lambda r: lambda exc: failed.append((r, exc)))(run))
        await asyncio.sleep(0)
        assert [r for r, _ in failed] == ["a", "b", "a"] and all(isinstance(e, StoreError) for _, e in failed)
        assert sub.pending == 0 and bus.group_commits == 0
        store._conn.execute("PRAGMA query_only = OFF")
        assert store.last_event_id() == 0  # all or none


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_concurrent_runs_store_every_delta_before_their_terminal_event(kind, tmp_path):
    config = (BrokerConfig(in_memory=True, default_model="claude-test-1") if kind == "memory"
              else BrokerConfig(data_dir=str(tmp_path / "relay"), default_model="claude-test-1"))
    broker = Broker.open(config)
    from relay_jupyter.backends.anthropic import AnthropicBackend

    try:
        with FakeAnthropic(api_key=KEY) as fake:
            broker.grants.issue(Grant(origin=K.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                      consent_id="c"))
            install_runtime(broker, {"anthropic": AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",))})
            sub = broker.events.subscribe(Caller(kind=CallerKind.BROWSER, origin=None, client_id="b", user="me"),
                                          maxsize=100_000)
            answer = " ".join(f"w{i}" for i in range(300))
            fake.enqueue(*[Reply(answer, chunk_tokens=1) for _ in range(8)])
            ids = [(await call_method(broker, K, "run.start", {"conversation": f"c{i}", "prompt": "go"}))["run_id"]
                   for i in range(8)]
            await asyncio.gather(*(broker.runs.wait(r) for r in ids))
            stored = broker.store.events_since(0)
            live = [i for i, _ in sub.drain()]
            assert live == [e.id for e in stored]  # every stored event delivered once, in order, none unstored
            for run_id in ids:
                mine = [e for e in stored if e.run_id == run_id]
                assert [e.type for e in mine if e.type in TERMINAL_EVENTS] == [EventType.DONE]
                assert mine[-1].type == EventType.DONE  # nothing of the run after its terminal event
                text = "".join(e.data["text"] for e in mine if e.type == EventType.TEXT_DELTA)
                assert text == answer
    finally:
        broker.close()
