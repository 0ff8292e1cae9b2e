"""Runs journal: intents before, outcomes after, interrupted runs at start."""

from __future__ import annotations

import pytest

from relay_jupyter.storage import Store


def test_run_lifecycle(store: Store, clock) -> None:
    store.run_started("r1", "o1", "c1", {"model": "m"})
    assert store.unfinished_runs() == ["r1"]
    store.call_intent("r1", "k1", "scratch__write", {"path": "a.txt"})
    store.call_intent("r1", "k2", "srv__read", {})
    assert [c["call_id"] for c in store.calls_without_outcome("r1")] == ["k1", "k2"]
    clock.advance(2)
    store.call_outcome("r1", "k1", {"is_error": False, "summary": "ok"})
    left = store.calls_without_outcome("r1")
    assert [(c["call_id"], c["tool"], c["arguments"], c["outcome"]) for c in left] == [("k2", "srv__read", {}, None)]
    store.run_finished("r1", "done", {"usage": {"input_tokens": 5}})
    assert store.unfinished_runs() == []
    run = store.get_run("r1")
    assert run is not None
    assert (run["state"], run["origin"], run["conversation"]) == ("done", "o1", "c1")
    assert run["meta"] == {"model": "m", "usage": {"input_tokens": 5}}
    assert run["finished_at"] == clock.now and run["started_at"] == clock.now - 2
    assert [(c["call_id"], c["outcome"]) for c in run["calls"]] == [
        ("k1", {"is_error": False, "summary": "ok"}), ("k2", None)]
    assert run["calls"][0]["outcome_at"] == clock.now


def test_list_runs_newest_first_and_by_origin(store: Store) -> None:
    for i in range(5):
        store.run_started(f"r{i}", "o1" if i % 2 else "o2", "c", {})
    assert [r["run_id"] for r in store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
    assert [r["run_id"] for r in store.list_runs(origin="o1")] == ["r3", "r1"]
    assert [r["run_id"] for r in store.list_runs(limit=2)] == ["r4", "r3"]
    assert store.list_runs(limit=0) == [] and store.list_runs(limit=-3) == []
    assert "calls" not in store.list_runs()[0]


def test_mark_interrupted(store: Store) -> None:
    store.run_started("a", "o", "c", {})
    store.run_started("b", "o", "c", {})
    store.run_started("c", "o", "c", {})
    store.run_finished("b", "cancelled")
    store.call_intent("a", "k", "srv__write", {"x": 1})
    assert store.mark_interrupted() == ["a", "c"]
    assert store.unfinished_runs() == []
    assert store.get_run("a")["state"] == "interrupted"
    assert store.get_run("b")["state"] == "cancelled"
    # the call's effect is unknown: it is reported, never replayed
    assert [c["call_id"] for c in store.calls_without_outcome("a")] == ["k"]
    assert store.mark_interrupted() == []


def test_journal_survives_reopen(db_path) -> None:
    with Store.open(db_path) as s:
        s.run_started("r", "o", "c", {})
        s.call_intent("r", "k", "t", {"a": 1})
    with Store.open(db_path) as s:  # as after a crash: the broker starts again
        assert s.mark_interrupted() == ["r"]
        assert s.calls_without_outcome("r")[0]["arguments"] == {"a": 1}


def test_unknown_run_and_call(store: Store) -> None:
    assert store.get_run("nope") is None
    assert store.calls_without_outcome("nope") == []
    with pytest.raises(KeyError):
        store.run_finished("nope", "done")
    store.run_started("r", "o", "c", {})
    with pytest.raises(KeyError):
        store.call_outcome("r", "never-intended", {})


@pytest.mark.parametrize("call", [
    lambda s: s.run_started("", "o", "c", {}),
    lambda s: s.run_started("r", "o", "c", None),
    lambda s: s.run_started("r", None, "c", {}),
    lambda s: s.run_finished("r0", "running"),
    lambda s: s.run_finished("r0", ""),
    lambda s: s.run_finished("r0", "done", ["not", "a", "dict"]),
    lambda s: s.call_intent("r0", "k", "t", "args"),
    lambda s: s.call_intent("r0", "", "t", {}),
    lambda s: s.call_outcome("r0", "k0", "ok"),
    lambda s: s.list_runs(limit="5"),
])
def test_bad_input_refused(store: Store, call) -> None:
    store.run_started("r0", "o", "c", {})
    store.call_intent("r0", "k0", "t", {})
    with pytest.raises((ValueError, TypeError)):
        call(store)
    run = store.get_run("r0")
    assert run["state"] == "running" and run["calls"][0]["outcome"] is None
