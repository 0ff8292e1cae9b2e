"""The contract every :class:`relay_jupyter.core.ports.Store` must pass (docs/storage.md).

Use it from a test module by subclassing :class:`StoreContract` and giving it a ``make_store``
fixture: a callable ``make_store(clock) -> Store`` that opens a fresh, empty store whose timestamps
come from ``clock`` (a :class:`ContractClock`)::

    @pytest.fixture
    def make_store(tmp_path):
        opened = []
        def make(clock):
            opened.append(Store.open(tmp_path / "relay.db", clock=clock))
            return opened[-1]
        yield make
        for s in opened:
            s.close()

    class TestSQLiteStore(StoreContract):
        pass

A store that several brokers share (SQLite on one data dir, PostgreSQL) may also give
``make_peer(store, clock) -> Store``: a second store object on the same storage (another broker);
the tests that need one are skipped otherwise. One that brokers in several processes share may give
``spawn_holder(store) -> HeldElsewhere``: another process (``relay_jupyter.testing.hold_worker``)
that takes a lease and a budget hold on the same storage and waits to be SIGKILLed, and the store
that judges it (``store`` itself, or a store of another user on the same database).

The suite grew out of the memory-vs-SQLite parity tests: :meth:`StoreContract.test_same_results_as_the_reference`
runs one scenario against the store and against :class:`~relay_jupyter.core.memory.MemoryStore`
and compares every answer. Concurrency properties are checked with threads in one process (holds
never overspend, concurrent adds are never lost, ids are unique).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ..core.errors import RelayError
from ..core.memory import MemoryStore
from ..core.ports import Checkpoint, CheckpointStore, Store
from ..core.telemetry import TelemetryRow
from ..core.types import Event, Grant, ToolClass
from ..protocol.names import TERMINAL_EVENTS, EventType
from ..protocol.sse import encode_event

__all__ = ["ContractClock", "HeldElsewhere", "StoreContract", "spawn_hold_worker"]

DAY = "2026-01-01"


class ContractClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Refused(Exception):
    pass


def _limit(tokens_per_day: int) -> Callable[[int, int], Callable[[int, float, int, float], None]]:
    def check_for(tokens: int, _unused: int = 0) -> Callable[[int, float, int, float], None]:
        def check(used_t: int, used_c: float, held_t: int, held_c: float) -> None:
            if used_t + held_t + tokens > tokens_per_day:
                raise _Refused
        return check
    return check_for


def _scenario(s: Any, clock: ContractClock) -> dict[str, Any]:
    """One scenario over every port; the answers must equal the reference's (MemoryStore)."""
    s.put_grant(Grant(origin="b", tools=frozenset({"t"}), consent_id="c", created_at=1.0))
    s.put_grant(Grant(origin="a", consent_id="c", created_at=1.0))
    s.add_usage("a", DAY, 5, 0.25)
    s.add_usage("a", DAY, 7, 0.5)
    first = s.append_event("x", {"n": 1}, origin="a", run_id="r")
    batch = s.append_events([("y", {"n": 2}, None, None), ("z", {"n": [3]}, "b", "r")])
    s.run_started("r1", "a", "c", {"m": 1})
    s.run_started("r2", "b", "c", {})
    s.call_intent("r1", "k1", "t", {"x": 1})
    s.call_intent("r1", "k2", "t", {"x": 2})
    s.call_outcome("r1", "k1", {"ok": True})
    clock.advance(1)
    s.run_finished("r1", "done", {"z": 2})
    ended = s.finish_run("r2", "cancelled", {"steps": 1}, [(EventType.CANCELLED, {"run_id": "r2"}, "b", "r2")])
    s.save_conversation("c1", "a", "first", [{"role": "user", "content": "hi", "turn": 0}], {"model": "m"})
    clock.advance(1)
    s.append_messages("c1", "a", "first", 1, [{"role": "assistant", "content": [{"type": "text", "text": "yo"}],
                                               "turn": 0}], {"model": "m"})
    s.save_conversation("c2", "b", "", [], {})
    s.add_trust("a", "", "t", "d1")
    s.add_trust("a", "srv", "t", "d1")
    s.put_pin("srv", "t", "d", "read")
    out = {
        "grants": [g.origin for g in s.list_grants()],
        "grant": s.get_grant("b"),
        "deleted": (s.delete_grant("a"), s.delete_grant("a"), s.get_grant("a")),
        "usage": (s.usage("a", DAY), s.usage("a", "2026-01-02")),
        "appended": [first, *batch],
        "since": [s.events_since(k) for k in (-5, 0, 1, 3, 99)],
        "limit": s.events_since(0, limit=2),
        "visible": [e.id for e in s.events_since(0, origins={"a"})],
        "replay": s.replay_sse(0, origins={"b"}),
        "last": s.last_event_id(),
        "first": s.first_event_id(),
        "unfinished": s.unfinished_runs(),
        "no_outcome": [(c["call_id"], c["arguments"]) for c in s.calls_without_outcome("r1")],
        "runs": [(r["run_id"], r["state"], r["meta"], r["finished_at"]) for r in s.list_runs()],
        "runs_b": [r["run_id"] for r in s.list_runs(origin="b", limit=5)],
        "get_run": s.get_run("r1"),
        "ended": None if ended is None else [e.type for e in ended[0]],
        "again": s.finish_run("r2", "done", None, [(EventType.DONE, {}, "b", "r2")]),
        "terminal": s.terminal_event("r2"),
        "conversation": s.load_conversation("c1"),
        "conversations": s.list_conversations(),
        "origin_of": (s.conversation_origin("c1"), s.conversation_origin("nope")),
        "trust": (s.has_trust("a", "", "t", "d1"), s.has_trust("a", "", "t", "d2"), s.has_trust("a", "srv", "t", "d1"),
                  s.has_trust("a", "srv_", "t", "d1"), s.list_trust()),
        "pin": (s.get_pin("srv", "t"), s.get_pin("", "srv__t"), s.list_pins()),
    }
    with pytest.raises(KeyError):
        s.run_finished("nope", "done")
    with pytest.raises(KeyError):
        s.call_outcome("r1", "nope", {})
    with pytest.raises(ValueError):
        s.add_usage("a", "d", -1, 0.0)
    return out


@dataclass
class HeldElsewhere:
    """A broker process holding ``tokens``/``cost_usd`` of ``key`` on ``day`` (``spawn_holder``), and
    ``judge``: a live broker's store on the same storage that should charge the hold once ``proc`` dies."""

    proc: subprocess.Popen[str]
    judge: Store
    key: str
    day: str
    tokens: int
    cost_usd: float


def spawn_hold_worker(args: list[str]) -> subprocess.Popen[str]:
    """Start ``relay_jupyter.testing.hold_worker`` with ``args`` and wait until its hold is committed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen([sys.executable, "-m", "relay_jupyter.testing.hold_worker", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if not line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the hold worker ended before holding anything (exit {proc.returncode})")
    assert "@" in json.loads(line)["hold"]  # the hold carries its owner
    return proc


class StoreContract:
    """The store contract as pytest tests; see the module docstring for how to use it."""

    # -- fixtures ------------------------------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> ContractClock:
        return ContractClock()

    @pytest.fixture
    def store(self, make_store: Callable[[ContractClock], Store], clock: ContractClock) -> Iterator[Store]:
        s = make_store(clock)
        yield s
        if not s.closed:
            s.close()

    @pytest.fixture
    def peer(self, request: pytest.FixtureRequest, store: Store, clock: ContractClock) -> Store:
        """A second store on the same storage (a second broker), or the test is skipped."""
        try:
            make_peer = request.getfixturevalue("make_peer")
        except pytest.FixtureLookupError:
            pytest.skip("this store is not shared between store objects")
        return make_peer(store, clock)

    # -- the protocol -------------------------------------------------------------------------------

    def test_implements_the_protocol(self, store: Store) -> None:
        assert isinstance(store, Store)
        assert isinstance(store.checkpoints, CheckpointStore)
        assert store.storage_problem is None and store.closed is False

    def test_same_results_as_the_reference(self, store: Store, clock: ContractClock) -> None:
        ref_clock = ContractClock(clock.now)
        expected = _scenario(MemoryStore(ref_clock), ref_clock)
        assert _scenario(store, clock) == expected

    # -- grants ---------------------------------------------------------------------------------------

    def test_grants_round_trip(self, store: Store) -> None:
        g = Grant(origin="o1", tools=frozenset({"a"}), models=frozenset({"m"}), consent_id="c1", expires_at=5.0)
        assert store.get_grant("o1") is None
        store.put_grant(g)
        assert store.get_grant("o1") == g
        store.put_grant(g.model_copy(update={"tools": frozenset()}))
        assert store.get_grant("o1").tools == frozenset()
        store.put_grant(Grant(origin="o0", consent_id="c0"))
        assert [x.origin for x in store.list_grants()] == ["o0", "o1"]
        assert store.delete_grant("o1") is True and store.delete_grant("o1") is False
        with pytest.raises(TypeError):
            store.put_grant({"origin": "x"})  # type: ignore[arg-type]

    # -- ledger and holds -----------------------------------------------------------------------------

    def test_ledger_adds_and_refuses_bad_amounts(self, store: Store) -> None:
        assert store.usage("o", DAY) == (0, 0.0)
        store.add_usage("o", DAY, 10, 0.5)
        store.add_usage("o", DAY, 5, 0.25)
        assert store.usage("o", DAY) == (15, 0.75)
        for bad in (-1, float("nan"), float("inf")):
            with pytest.raises(ValueError):
                store.add_usage("o", DAY, bad, 0.0)
        with pytest.raises(TypeError):
            store.add_usage("o", DAY, True, 0.0)
        assert store.usage("o", DAY) == (15, 0.75)

    def test_concurrent_adds_are_not_lost(self, store: Store) -> None:
        def work() -> None:
            for _ in range(100):
                store.add_usage("o", DAY, 1, 0.01)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tokens, cost = store.usage("o", DAY)
        assert tokens == 600 and abs(cost - 6.0) < 1e-6

    def test_hold_refused_by_its_check_writes_nothing(self, store: Store) -> None:
        store.add_usage("o", DAY, 90, 0.0)
        check = _limit(100)
        h = store.hold("o", DAY, 10, 0.0, now=0.0, expires_at=100.0, check=check(10))
        assert store.held("o", DAY) == (10, 0.0)
        with pytest.raises(_Refused):
            store.hold("o", DAY, 1, 0.0, now=0.0, expires_at=100.0, check=check(1))
        assert store.held("o", DAY) == (10, 0.0)
        assert store.finish_hold(h, 4, 0.0) is True
        assert store.usage("o", DAY) == (94, 0.0) and store.held("o", DAY) == (0, 0.0)
        assert store.finish_hold(h, 4, 0.0) is False  # idempotent: nothing committed twice
        assert store.usage("o", DAY) == (94, 0.0)

    def test_the_check_sees_usage_and_live_holds(self, store: Store) -> None:
        store.add_usage("o", DAY, 3, 0.5)
        store.hold("o", DAY, 4, 0.25, now=0.0, expires_at=100.0, check=lambda *a: None)
        seen: list[tuple[int, float, int, float]] = []
        store.hold("o", DAY, 1, 0.0, now=0.0, expires_at=100.0, check=lambda *a: seen.append(a))
        store.hold("o", "2026-01-02", 1, 0.0, now=0.0, expires_at=100.0, check=lambda *a: seen.append(a))
        assert seen == [(3, 0.5, 4, 0.25), (0, 0.0, 0, 0.0)]

    def test_concurrent_holds_never_overspend(self, store: Store) -> None:
        limit, each, workers = 50, 3, 8
        check = _limit(limit)
        granted: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(workers)

        def work() -> None:
            start.wait()
            for _ in range(10):
                try:
                    h = store.hold("o", DAY, each, 0.0, now=0.0, expires_at=100.0, check=check(each))
                except _Refused:
                    continue
                with lock:
                    granted.append(h)

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(granted) == limit // each  # every hold that fits was granted, none beyond
        assert store.held("o", DAY)[0] == len(granted) * each <= limit
        for h in granted:
            store.finish_hold(h, each, 0.0)
        assert store.usage("o", DAY)[0] <= limit

    def test_expired_holds_are_charged_once(self, store: Store) -> None:
        h = store.hold("o", DAY, 10, 1.0, now=0.0, expires_at=10.0, check=lambda *a: None)
        assert store.sweep_holds(5.0) == 0
        assert store.sweep_holds(10.0) == 1
        assert store.sweep_holds(11.0) == 0
        assert store.usage("o", DAY) == (10, 1.0) and store.held("o", DAY) == (0, 0.0)
        # a late settle adds only what exceeds the charged amount, and says the hold was not live
        assert store.finish_hold(h, 12, 0.5) is False
        assert store.usage("o", DAY) == (12, 1.0)
        assert store.finish_hold(h, 12, 0.5) is False
        assert store.usage("o", DAY) == (12, 1.0)

    def test_holds_of_a_dead_broker_are_charged_at_once(self, store: Store, clock: ContractClock) -> None:
        # no owner yet (as an older relay-jupyter's holds), taken as the lease below starts: it may own it
        legacy = store.hold("o", DAY, 1, 0.0, now=clock.now, expires_at=1e12, check=lambda *a: None)
        store.acquire_lease()
        h = store.hold("o", DAY, 10, 1.0, now=clock.now, expires_at=1e12, check=lambda *a: None)
        assert store.charge_dead_holds() == 0 and store.held("o", DAY) == (11, 1.0)  # its broker lives
        store.release_lease()  # the lease is gone: the broker that took h is dead, and no live one owns legacy
        assert store.charge_dead_holds() == 2 and store.charge_dead_holds() == 0
        assert store.usage("o", DAY) == (11, 1.0) and store.held("o", DAY) == (0, 0.0)
        assert store.finish_hold(h, 12, 0.5) is False and store.usage("o", DAY) == (13, 1.0)  # only the excess
        assert store.finish_hold(legacy, None, None) is False and store.usage("o", DAY) == (13, 1.0)

    def test_a_hold_without_owner_waits_only_while_a_live_lease_could_own_it(self, store: Store,
                                                                              clock: ContractClock) -> None:
        # holds of an older relay-jupyter (no owner in the id): one taken an hour before the live broker
        # started (its taker is gone), one 30 s before (within the clock skew allowed: it may be the
        # live broker's)
        gone = store.hold("o", DAY, 5, 0.5, now=clock.now - 3600, expires_at=1e12, check=lambda *a: None)
        maybe = store.hold("o", DAY, 3, 0.25, now=clock.now - 30, expires_at=1e12, check=lambda *a: None)
        assert "@" not in gone and "@" not in maybe
        store.acquire_lease()
        assert store.charge_dead_holds() == 1 and store.charge_dead_holds() == 0
        assert store.usage("o", DAY) == (5, 0.5) and store.held("o", DAY) == (3, 0.25)
        assert store.finish_hold(gone, 4, 0.5) is False and store.usage("o", DAY) == (5, 0.5)  # charged in full
        clock.advance(3600)  # a lease renewed later still started when it started
        store.renew_lease()
        assert store.charge_dead_holds() == 0 and store.held("o", DAY) == (3, 0.25)
        store.release_lease()
        assert store.charge_dead_holds() == 1 and store.usage("o", DAY) == (8, 0.75)

    def test_a_hold_sweeps_expired_ones_first(self, store: Store) -> None:
        store.hold("o", DAY, 10, 0.0, now=0.0, expires_at=10.0, check=lambda *a: None)
        seen: list[tuple[int, float, int, float]] = []
        store.hold("o", DAY, 1, 0.0, now=20.0, expires_at=30.0, check=lambda *a: seen.append(a))
        assert seen == [(10, 0.0, 0, 0.0)]

    def test_a_hold_never_sent_commits_nothing(self, store: Store) -> None:
        h = store.hold("o", DAY, 10, 1.0, now=0.0, expires_at=10.0, check=lambda *a: None)
        assert store.finish_hold(h, None, None) is True
        assert store.usage("o", DAY) == (0, 0.0) and store.held("o", DAY) == (0, 0.0)

    # -- team limits ----------------------------------------------------------------------------------

    def test_team_limits_round_trip_and_bad_ones_write_nothing(self, store: Store) -> None:
        assert store.team_limits() == {}
        assert store.put_team_limits("ml", {"tokens_per_day": 1500, "cost_per_month_usd": 12.5}) is True
        assert store.put_team_limits("ml", {"tokens_per_day": 7}, replace=False) is False  # a seed: never over a set one
        assert store.put_team_limits("ops", {}, replace=False) is True
        none = {"tokens_per_day": None, "cost_per_day_usd": None, "tokens_per_month": None, "cost_per_month_usd": None}
        assert store.team_limits() == {"ml": {**none, "tokens_per_day": 1500, "cost_per_month_usd": 12.5}, "ops": none}
        store.put_team_limits("ml", {"cost_per_day_usd": 4})
        assert store.team_limits()["ml"] == {**none, "cost_per_day_usd": 4.0}
        for team, limits in (("ml", {"tokens_per_day": -1}), ("ml", {"cost_per_day_usd": float("nan")}),
                             ("ml", {"members": ["x"]}), ("bad name", {}), ("", {}), ("ml", [1])):
            with pytest.raises((TypeError, ValueError)):
                store.put_team_limits(team, limits)  # type: ignore[arg-type]
        assert store.team_limits()["ml"] == {**none, "cost_per_day_usd": 4.0} and len(store.team_limits()) == 2
        with pytest.raises(_Refused):
            with store.transaction():
                store.put_team_limits("late", {"tokens_per_day": 1})
                raise _Refused
        assert "late" not in store.team_limits()

    def test_two_brokers_read_one_teams_limits(self, store: Store, peer: Store) -> None:
        store.put_team_limits("ml", {"tokens_per_day": 1500})
        assert peer.team_limits() == store.team_limits() and peer.team_limits()["ml"]["tokens_per_day"] == 1500
        peer.put_team_limits("ml", {"tokens_per_day": 900})
        assert store.team_limits()["ml"]["tokens_per_day"] == 900

    # -- events ---------------------------------------------------------------------------------------

    def test_event_ids_increase_and_batches_are_consecutive(self, store: Store) -> None:
        a = store.append_event("t", {"n": 1})
        batch = store.append_events([("t", {"n": i}, None, None) for i in range(5)])
        assert [e.id for e in batch] == list(range(a.id + 1, a.id + 6))
        assert store.last_event_id() == a.id + 5 and store.append_events([]) == []

    def test_a_malformed_batch_writes_nothing(self, store: Store) -> None:
        store.append_event("t", {})
        bad: list[Any] = [("t\nx", {}, None, None), ("t", [], None, None), ("", {}, None, None),
                          ("t", {}, "", None), ("t", {}, None, "a\x00"), ("t", {})]
        for item in bad:
            with pytest.raises((TypeError, ValueError)):
                store.append_events([("ok", {}, None, None), item])
        assert [e.type for e in store.events_since(0)] == ["t"] and store.last_event_id() == 1

    def test_returned_events_are_what_is_stored(self, store: Store) -> None:
        data = {"text": "line\nnext \u2028 \"q\" é 😀", "nested": {"list": [1, 2.5, None, True]}}
        events, frames = store.append_events_framed([("run.text_delta", data, "nb:\"w\"\\p#k", "r1"),
                                                     ("run.done", {}, None, None)])
        data["text"] = "changed after the append"
        assert events[0].data["text"].startswith("line")
        assert store.events_since(0) == events
        assert frames == [encode_event(e) for e in events]
        assert all(isinstance(e, Event) for e in events)

    def test_events_since_and_visibility(self, store: Store) -> None:
        store.append_events([("t", {}, "a", None), ("t", {}, None, None), ("t", {}, "b", None), ("t", {}, "c", None)])
        ids = lambda evs: [e.id for e in evs]  # noqa: E731
        assert ids(store.events_since(-3)) == [1, 2, 3, 4] and store.events_since(4) == []
        assert ids(store.events_since(1, limit=2)) == [2, 3] and store.events_since(0, limit=0) == []
        assert ids(store.events_since(0, origins={"a"})) == [1, 2]
        assert ids(store.events_since(0, origins=["b", "c"])) == [2, 3, 4]
        assert ids(store.events_since(0, origins=())) == [2]
        assert ids(store.events_since(0, origins={"' OR 1=1 --"})) == [2]
        with pytest.raises(TypeError):
            store.events_since("0")  # type: ignore[arg-type]

    def test_replay_pages_cover_every_visible_frame_with_bounded_pages(self, store: Store) -> None:
        items = [("t", {"n": i}, ("a" if i % 3 else None) if i % 2 else "b", None) for i in range(57)]
        events = store.append_events(items)
        want = b"".join(encode_event(e) for e in events if e.origin in (None, "a"))
        got, since, pages = b"", 0, 0
        while True:
            last, frames = store.replay_sse(since, limit=10, origins={"a"})
            if last == since:
                assert frames == b""
                break
            assert since < last <= since + 10  # a page scans at most `limit` events
            got, since, pages = got + frames, last, pages + 1
        assert got == want and pages == 6
        assert store.replay_sse(0) == (57, b"".join(encode_event(e) for e in events))
        assert store.replay_sse(57, limit=10) == (57, b"")

    def test_retention_removes_a_prefix_and_ids_are_never_reused(self, store: Store, clock: ContractClock) -> None:
        for i in range(10):
            store.append_event("t", {"n": i})
            clock.advance(10)
        assert store.prune_events(max_count=4) == 6
        assert [e.data["n"] for e in store.events_since(0)] == [6, 7, 8, 9]
        assert store.first_event_id() == 7 and store.last_event_id() == 10
        last, frames = store.replay_sse(0, limit=3)  # a since below the retained ids starts at the first one
        assert last == 9 and frames.count(b"id: ") == 3
        assert store.prune_events(max_age_s=25) == 2  # now is 1_000_100: events at 60, 70 go
        assert store.prune_events(max_count=0) == 2
        assert store.events_since(0) == [] and store.first_event_id() == 11 and store.last_event_id() == 10
        # nothing retained: a replay scanned nothing and says so (not the newest id ever handed out)
        assert store.replay_sse(0) == (0, b"") and store.replay_sse(3, limit=5) == (3, b"")
        assert store.append_event("t", {}).id == 11
        with pytest.raises(ValueError):
            store.prune_events(max_count=-1)

    # -- the runs journal -----------------------------------------------------------------------------

    def test_a_run_ends_once(self, store: Store) -> None:
        store.run_started("r", "o", "c", {"model": "m"})
        first = store.finish_run("r", "done", {"steps": 2}, [(EventType.DONE, {"run_id": "r"}, "o", "r")])
        assert first is not None and [e.type for e in first[0]] == [EventType.DONE]
        assert first[1] == [encode_event(first[0][0])]
        assert store.finish_run("r", "error", None, [(EventType.ERROR, {}, "o", "r")]) is None
        run = store.get_run("r")
        assert run is not None and run["state"] == "done" and run["meta"] == {"model": "m", "steps": 2}
        assert store.terminal_event("r") == first[0][0]
        assert [e.type for e in store.events_since(0)] == [EventType.DONE]
        with pytest.raises(KeyError):
            store.finish_run("nope", "done", None, [])
        with pytest.raises(ValueError):
            store.finish_run("r", "running", None, [])
        assert TERMINAL_EVENTS  # the contract's terminal types are the protocol's

    def test_calls_and_recovery_listing(self, store: Store) -> None:
        store.run_started("r", "o", "c", {})
        store.call_intent("r", "k1", "t", {"x": 1})
        store.call_intent("r", "k2", "t", {"x": 2})
        store.call_outcome("r", "k1", {"status": "ok"})
        assert [c["call_id"] for c in store.calls_without_outcome("r")] == ["k2"]
        run = store.get_run("r")
        assert run is not None and [(c["call_id"], c["outcome"]) for c in run["calls"]] == \
            [("k1", {"status": "ok"}), ("k2", None)]
        assert [r["run_id"] for r in store.runs_to_recover(set())] == ["r"]
        assert store.runs_to_recover(set())[0]["owner"] is None
        assert store.running_elsewhere("c") is False
        assert store.mark_interrupted() == ["r"] and store.unfinished_runs() == []
        assert store.get_run("r")["state"] == "interrupted"  # type: ignore[index]
        assert store.get_run("nope") is None

    def test_runs_of_a_live_owner_are_not_recovered(self, store: Store) -> None:
        me = store.acquire_lease()
        assert me == store.owner_id and me in store.live_owners()
        store.run_started("mine", "o", "c", {})
        assert store.runs_to_recover() == []
        assert [r["run_id"] for r in store.runs_to_recover(set())] == ["mine"]
        store.release_lease()
        assert store.owner_id is None and [r["run_id"] for r in store.runs_to_recover()] == ["mine"]

    def test_pending_permissions_follow_their_events(self, store: Store) -> None:
        store.acquire_lease()
        store.append_events([(EventType.PERMISSION_REQUEST, {"request_id": "q1"}, "o", "r"),
                             (EventType.PERMISSION_REQUEST, {"request_id": "q2"}, "o", "r2")])
        pending = store.pending_permissions()
        assert [(p["request_id"], p["owner"], p["event_id"]) for p in pending] == \
            [("q1", store.owner_id, 1), ("q2", store.owner_id, 2)]
        assert [p["request_id"] for p in store.pending_permissions(run_id="r2")] == ["q2"]
        assert store.pending_permissions(live=store.live_owners()) == []
        store.append_event(EventType.PERMISSION_RESOLVED, {"request_id": "q1"}, origin="o", run_id="r")
        store.append_event(EventType.PERMISSION_TIMEOUT, {"request_id": "q2"}, origin="o", run_id="r2")
        assert store.pending_permissions() == []

    # -- transactions ---------------------------------------------------------------------------------

    def test_a_transaction_commits_together_or_not_at_all(self, store: Store) -> None:
        store.run_started("r", "o", "c", {})
        with pytest.raises(_Refused), store.transaction():
            store.put_grant(Grant(origin="o", consent_id="c"))
            store.add_usage("o", DAY, 5, 0.0)
            store.finish_run("r", "done", None, [(EventType.DONE, {}, "o", "r")])
            store.append_messages("conv", "o", "", 0, [{"role": "user"}], {})
            raise _Refused
        assert store.get_grant("o") is None and store.usage("o", DAY) == (0, 0.0)
        assert store.unfinished_runs() == ["r"] and store.events_since(0) == [] and store.last_event_id() == 0
        assert store.load_conversation("conv") is None
        with store.transaction():
            store.put_grant(Grant(origin="o", consent_id="c"))
            with pytest.raises(_Refused), store.transaction():
                store.add_usage("o", DAY, 5, 0.0)
                raise _Refused
            stored = store.finish_run("r", "done", None, [(EventType.DONE, {}, "o", "r")])
        assert stored is not None and store.get_grant("o") is not None and store.usage("o", DAY) == (0, 0.0)
        assert store.unfinished_runs() == [] and store.append_event("t", {}).id == 2

    # -- conversations --------------------------------------------------------------------------------

    def test_a_transaction_belongs_to_its_thread_alone(self, store: Store) -> None:
        """Store calls run on worker threads (runtime/offload.py): a write another thread makes while
        this thread's transaction is open is never part of it (it is not undone by its rollback)."""
        done: list[BaseException | None] = []

        def other() -> None:
            try:
                store.put_grant(Grant(origin="other-thread", consent_id="c", created_at=1.0))
                done.append(None)
            except BaseException as exc:  # pragma: no cover - reported below
                done.append(exc)

        worker = threading.Thread(target=other)
        with pytest.raises(_Refused):
            with store.transaction():
                store.put_grant(Grant(origin="this-thread", consent_id="c", created_at=1.0))
                worker.start()  # it writes now (PostgreSQL: on its own connection) or after (one writer)
                raise _Refused
        worker.join(30)
        assert done == [None]
        assert store.get_grant("this-thread") is None and store.get_grant("other-thread") is not None

    def test_conversations_append_only(self, store: Store, clock: ContractClock) -> None:
        m = [{"role": "user", "content": f"m{i}", "turn": i // 2} for i in range(6)]
        store.append_messages("c", "o", "name", 0, m[:2], {"model": "x"})
        created = store.load_conversation("c")["created_at"]  # type: ignore[index]
        clock.advance(5)
        store.append_messages("c", "o", "name", 2, m[2:4], {"model": "y"})
        store.append_messages("c", "o", "name", 2, m[2:4], {"model": "y"})  # idempotent
        row = store.load_conversation("c")
        assert row is not None and row["messages"] == m[:4] and row["meta"] == {"model": "y"}
        assert row["created_at"] == created and row["updated_at"] == created + 5
        store.append_messages("c", "o", "name", 3, [m[5]], {})  # replaces from 3 on
        assert store.load_conversation("c")["messages"] == [*m[:3], m[5]]  # type: ignore[index]
        with pytest.raises(ValueError):
            store.append_messages("c", "o", "name", 9, [m[0]], {})
        with pytest.raises(TypeError):
            store.append_messages("c", "o", "name", 0, ["not a dict"], {})  # type: ignore[list-item]
        assert store.list_conversations()[0]["message_count"] == 4
        row["messages"].append({"role": "x"})
        assert len(store.load_conversation("c")["messages"]) == 4  # type: ignore[index]

    def test_conversations_save_list_delete(self, store: Store, clock: ContractClock) -> None:
        store.save_conversation("c1", "a", "one", [{"role": "user", "content": "x"}], {})
        clock.advance(1)
        store.save_conversation("c2", "b", "two", [], {"k": 1})
        clock.advance(1)
        store.save_conversation("c1", "a", "one!", [], {})  # replaced, created_at kept
        assert [c["conv_id"] for c in store.list_conversations()] == ["c1", "c2"]
        assert [c["conv_id"] for c in store.list_conversations("b")] == ["c2"]
        summary = store.list_conversations("a")[0]
        assert summary["message_count"] == 0 and summary["name"] == "one!" and "messages" not in summary
        assert store.conversation_origin("c2") == "b" and store.conversation_origin("c9") is None
        assert store.delete_conversation("c1") is True and store.delete_conversation("c1") is False
        assert store.load_conversation("c1") is None
        store.append_messages("c1", "a", "", 0, [{"role": "user"}], {})  # a deleted id starts afresh
        assert store.load_conversation("c1")["messages"] == [{"role": "user"}]  # type: ignore[index]

    # -- trust and pins -------------------------------------------------------------------------------

    def test_trust_is_bound_to_the_digest(self, store: Store) -> None:
        store.add_trust("o", "", "t", "d1")
        store.add_trust("o", "", "u", "d1")
        store.add_trust("p", "", "t", "d1")
        assert store.has_trust("o", "", "t", "d1") and not store.has_trust("o", "", "t", "d2")
        store.add_trust("o", "", "t", "d2")
        assert store.has_trust("o", "", "t", "d2") and not store.has_trust("o", "", "t", "d1")
        assert [(r["origin"], r["tool"]) for r in store.list_trust()] == [("o", "t"), ("o", "u"), ("p", "t")]
        assert store.revoke_trust("o", server="", tool="t") == 1 and store.revoke_trust("o") == 1
        assert [r["origin"] for r in store.list_trust()] == ["p"]
        with pytest.raises(ValueError):
            store.revoke_trust("p", tool="t")  # a tool is named by (server, tool)

    def test_trust_is_keyed_by_server_and_tool_never_a_joined_name(self, store: Store) -> None:
        # every pair below joins to "a___x" (or "a__b__c") with the "__" separator: none may answer for another
        pairs = [("a_", "x"), ("a", "_x"), ("", "a___x"), ("a__b", "c"), ("a", "b__c"), ("", "a__b__c")]
        store.add_trust("o", "a_", "x", "d")
        store.add_trust("o", "a__b", "c", "d")
        trusted = [pair for pair in pairs if store.has_trust("o", *pair, "d")]
        assert trusted == [("a_", "x"), ("a__b", "c")]
        assert [(r["server"], r["tool"]) for r in store.list_trust("o")] == [("a_", "x"), ("a__b", "c")]
        assert store.revoke_trust("o", server="a", tool="_x") == 0 and store.has_trust("o", "a_", "x", "d")
        assert store.revoke_trust("o", server="a") == 0
        assert store.revoke_trust("o", server="a_") == 1 and not store.has_trust("o", "a_", "x", "d")
        with pytest.raises(ValueError):
            store.add_trust("o", "a", "", "d")

    def test_pins(self, store: Store) -> None:
        store.put_pin("s", "b", "d", ToolClass.WRITE)
        store.put_pin("s", "a", "d", "read")
        assert store.get_pin("s", "a") == ("d", ToolClass.READ)
        assert [(p["server"], p["tool"], p["tool_class"]) for p in store.list_pins()] == [
            ("s", "a", ToolClass.READ), ("s", "b", ToolClass.WRITE)]
        with pytest.raises(ValueError):
            store.put_pin("s", "c", "d", "root")
        with pytest.raises(ValueError):
            store.put_pin("", "c", "d", "read")  # only MCP tools (a server) are pinned
        assert store.delete_pin("s", "a") is True and store.delete_pin("s", "a") is False
        assert store.get_pin("s", "a") is None

    def test_pins_are_keyed_by_server_and_tool_never_a_joined_name(self, store: Store) -> None:
        store.put_pin("a_", "x", "d", "read")
        store.put_pin("a__b", "c", "d", "read")
        for other in (("a", "_x"), ("a", "b__c"), ("a", "b")):
            assert store.get_pin(*other) is None
            assert store.delete_pin(*other) is False
        assert store.get_pin("a_", "x") == ("d", ToolClass.READ) and store.get_pin("a__b", "c") == ("d", ToolClass.READ)
        store.put_pin("a", "_x", "d", "write")  # its own row: the other pin is unchanged
        assert store.get_pin("a_", "x") == ("d", ToolClass.READ)
        assert [(p["server"], p["tool"]) for p in store.list_pins()] == [("a", "_x"), ("a_", "x"), ("a__b", "c")]

    # -- checkpoints ----------------------------------------------------------------------------------

    def test_checkpoint_lifecycle(self, store: Store) -> None:
        store.acquire_lease()
        cp = store.checkpoints
        a = cp.prepare(origin="o", conversation="c", run_id="r", target="a.txt", pre_image=b"old",
                       pending_sha256="1" * 64)
        b = cp.prepare(origin="o", conversation="c", run_id="r", target="b.txt", pre_image=None,
                       pending_sha256="2" * 64)
        assert isinstance(a, Checkpoint) and a.state == "prepared" and a.pre_exists and not b.pre_exists
        assert cp.pre_image(a.id) == b"old" and cp.pre_image(b.id) is None
        assert cp.owner_of(a.id) == store.owner_id
        assert cp.unfinished() == [] and [c.id for c in cp.unfinished(all_owners=True)] == [a.id, b.id]
        cp.mark_applied(a.id, "3" * 64, "ok")
        assert cp.active("r", "a.txt").state == "applied"  # type: ignore[union-attr]
        cp.prepare_again(a.id, "4" * 64)
        assert cp.get(a.id).pending_sha256 == "4" * 64  # type: ignore[union-attr]
        assert [c.id for c in cp.cascade(a.id)] == [b.id, a.id]
        assert [c.id for c in cp.list(origin="o")] == [b.id, a.id] and cp.list(origin="x") == []
        cp.mark_reverting(a.id)
        cp.mark_reverted(a.id, "back")
        got = cp.get(a.id)
        assert got is not None and got.state == "reverted" and got.note == "back" and cp.pre_image(a.id) is None
        assert cp.active("r", "a.txt") is None and cp.get("ckpt_nope") is None
        assert set(got.public()) >= {"id", "target", "state", "pre_sha256", "post_sha256"}

    def test_checkpoints_of_a_dead_owner_are_unfinished(self, store: Store) -> None:
        made = store.checkpoints.prepare(origin="o", conversation=None, run_id="r", target="x", pre_image=b"",
                                         pending_sha256="0" * 64)
        assert [c.id for c in store.checkpoints.unfinished()] == [made.id]  # no owner: nobody's, dead

    # -- leases and health ----------------------------------------------------------------------------

    def test_leases(self, store: Store) -> None:
        assert store.owner_id is None and store.leases() == []
        me = store.acquire_lease(ttl=5.0)
        assert store.lease_ttl == 5.0 and [r["owner_id"] for r in store.leases()] == [me]
        store.renew_lease()
        assert store.forget_dead_leases() == 0
        assert store.forget_dead_leases(live=set()) == 1 and store.leases() == []
        store.renew_lease()  # re-created after another broker deleted it as dead
        assert [r["owner_id"] for r in store.leases()] == [me]
        store.release_lease()
        store.release_lease()  # idempotent
        assert store.leases() == [] and store.owner_id is None

    def test_health_and_close(self, store: Store) -> None:
        store.probe_write()
        store.check_space()
        assert store.storage_problem is None
        store.close()
        store.close()  # idempotent
        assert store.closed
        with pytest.raises(RelayError):
            store.put_grant(Grant(origin="o", consent_id="c"))

    # -- telemetry (core/telemetry.py) -----------------------------------------------------------------

    @staticmethod
    def _trow(origin: str, ts: float, **kw: Any) -> TelemetryRow:
        return TelemetryRow(ts=ts, origin=origin, source=kw.pop("source", "proxy"),
                            model=kw.pop("model", "claude-sonnet-4-5"), **kw)

    def test_telemetry_rows_round_trip_with_every_field(self, store: Store) -> None:
        row = self._trow("notebook:a.ipynb", 10.5, session="s_1", lineage="undo", run_id="run_1",
                         profile="team", input_tokens=7, output_tokens=3, cache_read_tokens=2,
                         cache_write_tokens=1, cost_usd=0.125, estimated=True, latency_ms=12.5, ttft_ms=4.25,
                         status="interrupted", error_code="BUDGET_EXCEEDED")
        stored = store.record_telemetry(row)
        assert stored.id >= 1 and stored.model_copy(update={"id": 0}) == row
        assert store.query_telemetry() == [stored]
        bare = store.record_telemetry(self._trow("o", 11.0, source="agent"))
        assert bare.id > stored.id and bare.ttft_ms is None and bare.session is None and bare.estimated is False
        assert store.query_telemetry() == [stored, bare]

    def test_telemetry_query_by_origin_since_and_limit(self, store: Store) -> None:
        rows = [store.record_telemetry(self._trow(o, ts)) for o, ts in
                [("a", 1.0), ("b", 2.0), ("a", 3.0), ("a", 4.0), ("b", 5.0)]]
        assert [r.id for r in rows] == sorted(r.id for r in rows) and len({r.id for r in rows}) == 5
        assert store.query_telemetry(origin="a") == [rows[0], rows[2], rows[3]]
        assert store.query_telemetry(since=3.0) == rows[2:]
        assert store.query_telemetry(origin="b", since=2.5) == [rows[4]]
        assert store.query_telemetry(limit=2) == rows[3:]  # the newest two, oldest first
        assert store.query_telemetry(origin="a", limit=1) == [rows[3]]
        assert store.query_telemetry(limit=0) == [] and store.query_telemetry(limit=-3) == []
        assert store.query_telemetry(origin="nobody") == []
        assert store.query_telemetry(origin="a' OR '1'='1") == []  # parameters, not SQL text

    def test_telemetry_refuses_what_is_not_a_row(self, store: Store) -> None:
        with pytest.raises(TypeError):
            store.record_telemetry({"ts": 1.0, "origin": "o"})  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.query_telemetry(since="yesterday")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.query_telemetry(origin="")
        assert store.query_telemetry() == []

    def test_telemetry_prune_and_ids_never_reused(self, store: Store) -> None:
        a = store.record_telemetry(self._trow("o", 1.0))
        b = store.record_telemetry(self._trow("o", 2.0))
        assert store.prune_telemetry(2.0) == 1 and store.query_telemetry() == [b]
        assert store.prune_telemetry(10.0) == 1 and store.query_telemetry() == []
        c = store.record_telemetry(self._trow("o", 3.0))
        assert c.id > b.id > a.id

    def test_telemetry_rolls_back_with_its_transaction(self, store: Store) -> None:
        with pytest.raises(_Refused), store.transaction():
            store.record_telemetry(self._trow("o", 1.0))
            raise _Refused
        assert store.query_telemetry() == []

    # -- two store objects on one storage (two brokers) -----------------------------------------------

    def test_a_sigkilled_brokers_holds_are_charged_at_once(self, request: pytest.FixtureRequest, store: Store
                                                           ) -> None:
        """Two processes (issue 12): another broker takes a hold that never expires and is SIGKILLed;
        a live broker's ``charge_dead_holds`` charges it in full at once, and only once. While it
        lives its hold is neither charged nor free budget."""
        try:
            spawn = request.getfixturevalue("spawn_holder")
        except pytest.FixtureLookupError:
            pytest.skip("this store is not shared between processes")
        store.acquire_lease()
        held = spawn(store)
        judge, key, day = held.judge, held.key, held.day
        try:
            assert judge.held(key, day) == (held.tokens, held.cost_usd)
            assert judge.charge_dead_holds() == 0 and judge.usage(key, day) == (0, 0.0)  # its broker lives
            held.proc.kill()
            held.proc.wait()
            assert judge.charge_dead_holds() == 1 and judge.charge_dead_holds() == 0
            assert judge.usage(key, day) == (held.tokens, held.cost_usd) and judge.held(key, day) == (0, 0.0)
        finally:
            if held.proc.poll() is None:
                held.proc.kill()
                held.proc.wait()

    def test_a_live_peers_holds_are_not_charged_as_dead(self, store: Store, peer: Store) -> None:
        store.acquire_lease()
        peer.acquire_lease()
        h = peer.hold("o", DAY, 5, 0.0, now=0.0, expires_at=1e12, check=lambda *a: None)
        assert store.charge_dead_holds() == 0 and store.held("o", DAY) == (5, 0.0)
        peer.release_lease()
        assert store.charge_dead_holds() == 1 and store.usage("o", DAY) == (5, 0.0)
        assert peer.finish_hold(h, 5, 0.0) is False and store.usage("o", DAY) == (5, 0.0)

    def test_two_brokers_share_holds_and_never_overspend(self, store: Store, peer: Store) -> None:
        check = _limit(30)
        granted: list[tuple[Store, str]] = []
        lock = threading.Lock()

        def work(s: Store) -> None:
            for _ in range(20):
                try:
                    h = s.hold("o", DAY, 2, 0.0, now=0.0, expires_at=100.0, check=check(2))
                except _Refused:
                    continue
                with lock:
                    granted.append((s, h))

        threads = [threading.Thread(target=work, args=(s,)) for s in (store, peer, store, peer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(granted) == 15 and peer.held("o", DAY) == (30, 0.0)

    def test_two_brokers_see_each_others_events_and_leases(self, store: Store, peer: Store) -> None:
        a = store.acquire_lease()
        b = peer.acquire_lease()
        store.append_event("t", {"n": 1})
        assert peer.append_event("t", {"n": 2}).id == 2 and store.last_event_id() == 2
        assert {a, b} <= store.live_owners()
        store.run_started("ra", "o", "c", {})
        assert peer.running_elsewhere("c") is True and store.running_elsewhere("c") is False
        assert peer.runs_to_recover() == []  # a's run: its owner is alive
