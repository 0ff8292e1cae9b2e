"""The broker's periodic storage check never recovers a run whose broker is alive.

Regression (2026-12-01): one of three ``%%agent`` benchmark rounds ended ``✗ interrupted`` mid-answer
while the broker was alive. Only recovery emits ``run.interrupted``: the maintenance step
(``Broker.check_storage``, every ``lease_ttl / 3``) asked ``runs_to_recover()``, and an in-memory
broker (what the benchmark's Jupyter server ran) has no lease, so its runs were stored with owner
None — which reads as "dead" — and every run still streaming at a tick was marked interrupted.

Here the storage check runs after **every** event of every run (the most often it could ever fire:
at each point where the event loop may switch), over many concurrent runs, for the in-memory and the
SQLite broker; each run must end ``run.done`` with exactly one terminal event. No timing is asserted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.recovery import recover
from relay_jupyter.storage.errors import StoreError
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply

from .rig import KEY, make_backend

A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb#k1", client_id="kernel:aaa")
RUNS = 12


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def _broker(kind: str, tmp_path: Path, fake: FakeAnthropic) -> Broker:
    if kind == "memory":
        config = BrokerConfig(in_memory=True, default_model="claude-test-1")
    else:
        config = BrokerConfig(data_dir=str(tmp_path / "relay"), default_model="claude-test-1")
    broker = Broker.open(config)
    broker.grants.issue(Grant(origin=A.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    install_runtime(broker, {"anthropic": make_backend("anthropic", fake)})
    return broker


def _check_after_every_event(broker: Broker) -> list[int]:
    """Run the maintenance step after every event the runs append (one at a time, or a group commit of
    text deltas); returns a counter of the checks."""
    bus, checks = broker.events, [0]

    def then_check(method):
        def wrapped(*args, **kwargs):
            result = method(*args, **kwargs)
            checks[0] += 1
            broker.check_storage()
            return result
        return wrapped

    bus.append = then_check(bus.append)  # type: ignore[method-assign]
    bus.flush = then_check(bus.flush)  # type: ignore[method-assign]
    return checks


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_concurrent_live_runs_are_never_recovered_by_the_storage_check(kind, tmp_path, fake):
    broker = _broker(kind, tmp_path, fake)
    try:
        checks = _check_after_every_event(broker)
        fake.enqueue(*[Reply("word " * 40, tokens_per_second=400, chunk_tokens=2) for _ in range(RUNS)])
        ids = [(await call_method(broker, A, "run.start", {"conversation": f"c{i}", "prompt": "go"}))["run_id"]
               for i in range(RUNS)]
        await asyncio.gather(*(broker.runs.wait(r) for r in ids))
        events = broker.store.events_since(0)
        for run_id in ids:
            terminals = [e.type for e in events if e.run_id == run_id and e.type in TERMINAL_EVENTS]
            assert terminals == [EventType.DONE], (run_id, terminals)
            assert broker.store.get_run(run_id)["state"] == "done"
        assert not [e for e in events if e.type == EventType.INTERRUPTED]
        assert checks[0] > RUNS * 3  # the check really ran while the runs streamed
    finally:
        broker.close()


def test_a_broker_whose_lease_could_not_be_written_owns_its_runs(tmp_path):
    """A broker that could not write its lease at start (a full or read-only disk) still has an owner
    id: the lease row is written by the first probe that succeeds, and its runs carry the id, so
    neither its own storage check nor another broker's recovery takes them for a dead broker's."""
    path = tmp_path / "relay.db"
    with Store.open(path) as store:
        store._conn.execute("PRAGMA query_only = ON")  # a real write failure: SQLITE_READONLY
        with pytest.raises(StoreError):
            store.acquire_lease(30.0)
        owner = store.owner_id
        assert owner is not None and store.leases() == [] and store.storage_problem is not None
        store._conn.execute("PRAGMA query_only = OFF")
        store.probe_write()  # what the broker's maintenance step does: the lease row is written
        assert [r["owner_id"] for r in store.leases()] == [owner] and store.storage_problem is None
        store.run_started("r1", A.origin, "c", {})
        assert store.runs_to_recover() == [] and recover(store, store, None) == []
        assert store.get_run("r1")["finished_at"] is None


def test_recovery_rechecks_the_owner_inside_its_transaction(tmp_path):
    """A broker that took its lease and started a run after recovery read the live owners (a second
    broker starting on the same data dir at that moment) is alive: recovery re-reads the owners inside
    the run's write transaction and leaves the run alone."""
    path = tmp_path / "relay.db"
    with Store.open(path) as a, Store.open(path) as b:
        a.acquire_lease(30.0)
        stale = a.live_owners()  # read before b exists
        b.acquire_lease(30.0)
        b.run_started("run_b", "notebook:b.ipynb", "conv-b", {})
        assert [r["run_id"] for r in a.runs_to_recover(stale)] == ["run_b"]  # what a stale read sees
        assert recover(a, a, None, live=stale) == []
        assert b.get_run("run_b")["finished_at"] is None
        assert [e for e in a.events_since(0) if e.type == EventType.INTERRUPTED] == []



@pytest.mark.asyncio
async def test_run_started_names_its_engine(tmp_path, fake):
    broker = _broker("memory", tmp_path, fake)
    try:
        fake.enqueue(Reply("hi"))
        run_id = (await call_method(broker, A, "run.start", {"conversation": "c", "prompt": "go"}))["run_id"]
        await broker.runs.wait(run_id)
        (started,) = [e for e in broker.store.events_since(0) if e.type == EventType.RUN_STARTED]
        assert started.data["engine"] == "relay" and started.data["backend"] == "anthropic"
    finally:
        broker.close()
