"""The in-memory ports behave as the Protocols of core/ports.py say."""

from __future__ import annotations

import threading

import pytest

from relay_jupyter.core.memory import (
    MemoryAuditSink,
    MemoryEventStore,
    MemoryGrantStore,
    MemoryLedger,
    MemoryRunJournal,
)
from relay_jupyter.core.ports import AuditSink, EventStore, GrantStore, Ledger, RunJournal
from relay_jupyter.core.types import AuditRecord, Grant


def test_memory_classes_satisfy_ports():
    assert isinstance(MemoryGrantStore(), GrantStore)
    assert isinstance(MemoryLedger(), Ledger)
    assert isinstance(MemoryAuditSink(), AuditSink)
    assert isinstance(MemoryEventStore(), EventStore)
    assert isinstance(MemoryRunJournal(), RunJournal)


def test_grant_store_roundtrip():
    store = MemoryGrantStore()
    g = Grant(origin="o1", tools=frozenset({"a"}), consent_id="c1")
    assert store.get_grant("o1") is None
    store.put_grant(g)
    assert store.get_grant("o1") == g
    store.put_grant(Grant(origin="o0", consent_id="c0"))
    assert [x.origin for x in store.list_grants()] == ["o0", "o1"]
    assert store.delete_grant("o1") is True
    assert store.delete_grant("o1") is False


def test_ledger_adds_and_refuses_negative():
    led = MemoryLedger()
    assert led.usage("o", "2026-01-01") == (0, 0.0)
    led.add_usage("o", "2026-01-01", 10, 0.5)
    led.add_usage("o", "2026-01-01", 5, 0.25)
    assert led.usage("o", "2026-01-01") == (15, 0.75)
    assert led.usage("o", "2026-01-02") == (0, 0.0)
    with pytest.raises(ValueError):
        led.add_usage("o", "2026-01-01", -1, 0.0)


def test_ledger_concurrent_adds_are_not_lost():
    led = MemoryLedger()

    def work():
        for _ in range(500):
            led.add_usage("o", "d", 1, 0.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert led.usage("o", "d")[0] == 4000


def test_audit_sink_sequence_and_tail():
    sink = MemoryAuditSink()
    for i in range(5):
        rec = sink.append(AuditRecord(ts=float(i), origin=f"o{i % 2}", tool="t", decision="allow"))
        assert rec.seq == i + 1
    assert [r.seq for r in sink.tail(2)] == [4, 5]
    assert [r.seq for r in sink.tail(10, origin="o1")] == [2, 4]
    assert sink.tail(0) == []


def test_event_store_ids_replay_and_retention():
    store = MemoryEventStore(max_events=3)
    e1 = store.append_event("a", {"x": 1}, origin="o")
    batch = store.append_events([("b", {}, None, "r"), ("c", {}, "o", None), ("d", {}, None, None)])
    assert e1.id == 1 and [e.id for e in batch] == [2, 3, 4]
    assert store.last_event_id() == 4
    assert [e.id for e in store.events_since(0)] == [2, 3, 4]  # retention dropped id 1
    assert [e.id for e in store.events_since(2, limit=1)] == [3]


def test_event_data_is_copied():
    store = MemoryEventStore()
    data = {"k": [1]}
    store.append_event("a", data)
    data["k"].append(2)
    assert store.events_since(0)[0].data == {"k": [1]}


def test_run_journal_intent_outcome():
    j = MemoryRunJournal()
    j.run_started("r1", "o", "c", {"model": "m"})
    j.run_started("r2", "p", "c", {})
    j.call_intent("r1", "k1", "tool", {"a": 1})
    j.call_intent("r1", "k2", "tool", {})
    j.call_outcome("r1", "k1", {"ok": True})
    assert [c["call_id"] for c in j.calls_without_outcome("r1")] == ["k2"]
    assert set(j.unfinished_runs()) == {"r1", "r2"}
    j.run_finished("r1", "done", {"steps": 2})
    assert j.unfinished_runs() == ["r2"]
    assert [r["run_id"] for r in j.list_runs()] == ["r2", "r1"]
    assert [r["run_id"] for r in j.list_runs(origin="o")] == ["r1"]
    assert j.list_runs(origin="o")[0]["meta"] == {"model": "m", "steps": 2}
    with pytest.raises(KeyError):
        j.call_outcome("r1", "nope", {})
    with pytest.raises(KeyError):
        j.run_finished("nope", "done")


def test_static_consent_rejects_unknown_decisions():
    from relay_jupyter.core.consent import StaticConsent

    with pytest.raises(ValueError):
        StaticConsent("maybe")
    with pytest.raises(ValueError):
        StaticConsent("allow", scope="forever")
