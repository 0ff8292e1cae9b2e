"""Event store: ids, replay since an id, SSE framing, visibility, retention, concurrency."""

from __future__ import annotations

import json
import threading

import pytest

from relay_jupyter.core.types import Event
from relay_jupyter.protocol.sse import encode_event, parse_stream
from relay_jupyter.storage import Store


def _fill(store: Store, n: int, **kw) -> list[Event]:
    return store.append_events([("t", {"i": i}, kw.get("origin"), kw.get("run_id")) for i in range(n)])


def test_append_returns_events_with_increasing_ids(store: Store, clock) -> None:
    e1 = store.append_event("run.started", {"run_id": "r"}, origin="o", run_id="r")
    assert (e1.id, e1.type, e1.origin, e1.run_id, e1.data, e1.ts) == (1, "run.started", "o", "r", {"run_id": "r"},
                                                                      clock.now)
    batch = _fill(store, 5)
    assert [e.id for e in batch] == [2, 3, 4, 5, 6]
    assert store.last_event_id() == 6
    assert store.events_since(0) == [e1, *batch]


def test_returned_events_equal_validated_ones(store: Store) -> None:
    """append_events builds its Events without validation (the values are checked already); they must
    behave exactly like validated ones, and not share the caller's data dict."""
    data = {"text": "hé", "n": [1, 2.5, None]}
    (e,) = store.append_events([("run.text_delta", data, "o", "r")])
    ref = Event(id=e.id, ts=e.ts, type="run.text_delta", origin="o", run_id="r", data={"text": "hé", "n": [1, 2.5, None]})
    assert e == ref and e.model_dump() == ref.model_dump() and e.model_dump_json() == ref.model_dump_json()
    assert e.model_fields_set == ref.model_fields_set and repr(e) == repr(ref)
    assert e.model_copy(update={"id": 99}).id == 99 and e.id == 1
    assert encode_event(e) == encode_event(ref)
    with pytest.raises(ValueError):
        e.id = 5  # type: ignore[misc]  # frozen like any Event
    data["text"] = "changed"
    assert e.data["text"] == "hé"


def test_empty_batch(store: Store) -> None:
    assert store.append_events([]) == []
    assert store.last_event_id() == 0
    assert store.first_event_id() == 1


def test_replay_since(store: Store) -> None:
    events = _fill(store, 10)
    assert store.events_since(7) == events[7:]
    assert store.events_since(-5) == events  # negative: from the start
    assert store.events_since(10) == []
    assert store.events_since(10_000) == []  # beyond the newest id
    assert store.events_since(0, limit=3) == events[:3]
    assert store.events_since(0, limit=0) == []
    assert store.events_since(2**62) == []


@pytest.mark.parametrize("since", ["5", 1.5, None, b"1"])
def test_replay_needs_an_integer(store: Store, since: object) -> None:
    with pytest.raises(TypeError):
        store.events_since(since)  # type: ignore[arg-type]


def test_batch_is_all_or_nothing(store: Store) -> None:
    _fill(store, 2)
    bad = [("t", {"ok": 1}, None, None), ("t", "not a dict", None, None)]
    with pytest.raises(TypeError):
        store.append_events(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.append_events([("t", {})])  # type: ignore[list-item]
    assert store.last_event_id() == 2
    assert len(store.events_since(0)) == 2


@pytest.mark.parametrize("type_,origin,run_id,error", [
    ("", None, None, ValueError), (None, None, None, TypeError), ("a\nb", None, None, ValueError),
    ("a\rb", None, None, ValueError), ("t", "", None, ValueError), ("t", None, 5, TypeError),
    ("t\x00", None, None, ValueError),
])
def test_malformed_event_refused(store: Store, type_: object, origin: object, run_id: object,
                                 error: type[Exception]) -> None:
    with pytest.raises(error):
        store.append_event(type_, {}, origin=origin, run_id=run_id)  # type: ignore[arg-type]
    assert store.last_event_id() == 0


def test_odd_values_in_data_are_stored_as_strings(store: Store, tmp_path) -> None:
    e = store.append_event("t", {"path": tmp_path})
    assert store.events_since(0)[0].data == {"path": str(tmp_path)}
    assert e.id == 1


def test_sse_replay_is_byte_identical_to_encode_event(store: Store) -> None:
    events = store.append_events([
        ("run.text_delta", {"text": "line\nnext \u2028 \"quoted\" é 😀"}, "notebook:a.ipynb#k", "r1"),
        ("permission.request", {"nested": {"list": [1, 2.5, None, True]}, "n": -3}, None, "r1"),
        ("run.done", {}, "o2", None),
        ("type \"q\" é\t", {"k": "\x00\x1f"}, "nb:\"weird\"\\path\t#k😀", "r\u2028"),
    ])
    last, frames = store.replay_sse(0)
    assert last == 4
    assert frames == b"".join(encode_event(e) for e in events)
    parsed, rest = parse_stream(frames.decode())
    assert rest == "" and [p["id"] for p in parsed] == ["1", "2", "3", "4"]
    assert [p["event"] for p in parsed] == ["run.text_delta", "permission.request", "run.done", events[3].type]
    assert [json.loads(p["data"]) for p in parsed] == [e.model_dump(mode="json") for e in events]
    assert store.events_since(0) == events
    assert store.replay_sse(4) == (4, b"")
    assert store.replay_sse(1, limit=1)[0] == 2


def test_visibility_filter(store: Store) -> None:
    store.append_events([("t", {}, "a", None), ("t", {}, None, None), ("t", {}, "b", None), ("t", {}, "c", None)])
    ids = lambda evs: [e.id for e in evs]
    assert ids(store.events_since(0)) == [1, 2, 3, 4]
    assert ids(store.events_since(0, origins={"a"})) == [1, 2]
    assert ids(store.events_since(0, origins=["b", "c"])) == [2, 3, 4]
    assert ids(store.events_since(0, origins=())) == [2]  # broadcast only
    assert ids(store.events_since(0, origins={"' OR 1=1 --"})) == [2]  # parameters, not SQL
    last, frames = store.replay_sse(0, origins={"c"})
    assert last == 4 and frames.count(b"id: ") == 2


def test_retention_by_count(store: Store) -> None:
    _fill(store, 10)
    assert store.prune_events(max_count=4) == 6
    assert [e.id for e in store.events_since(0)] == [7, 8, 9, 10]
    assert store.first_event_id() == 7
    assert store.prune_events(max_count=4) == 0
    assert store.prune_events(max_count=100) == 0
    # ids are never reused after pruning
    assert store.prune_events(max_count=0) == 4
    assert store.events_since(0) == []
    assert store.last_event_id() == 10
    assert store.first_event_id() == 11
    assert store.append_event("t", {}).id == 11


def test_ids_not_reused_after_reopen(db_path, clock) -> None:
    with Store.open(db_path, clock=clock) as s:
        _fill(s, 3)
        s.prune_events(max_count=0)
    with Store.open(db_path, clock=clock) as s:
        assert s.last_event_id() == 3
        assert s.append_event("t", {}).id == 4


def test_retention_by_age(store: Store, clock) -> None:
    _fill(store, 3)             # ts = T
    clock.advance(100)
    _fill(store, 2)             # ts = T + 100
    clock.advance(100)
    _fill(store, 1)             # ts = T + 200
    assert store.prune_events(max_age_s=150) == 3
    assert [e.id for e in store.events_since(0)] == [4, 5, 6]
    assert store.prune_events(max_age_s=50) == 2
    assert [e.id for e in store.events_since(0)] == [6]
    clock.advance(1000)
    assert store.prune_events(max_age_s=10) == 1
    assert store.events_since(0) == []


def test_retention_by_age_and_count_together(store: Store, clock) -> None:
    _fill(store, 5)
    clock.advance(100)
    _fill(store, 5)
    assert store.prune_events(max_age_s=50, max_count=3) == 7
    assert [e.id for e in store.events_since(0)] == [8, 9, 10]


def test_retention_keeps_a_prefix_when_the_clock_went_back(store: Store, clock) -> None:
    _fill(store, 2)
    clock.advance(-100)          # wall clock stepped back
    _fill(store, 2)
    clock.advance(300)
    _fill(store, 1)
    # the first two are young enough; pruning stops there, keeping ids contiguous
    assert store.prune_events(max_age_s=250) == 0
    assert [e.id for e in store.events_since(0)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kw", [{"max_count": -1}, {"max_age_s": -1}, {"max_age_s": "1"}, {"max_count": 1.5}])
def test_prune_refuses_bad_limits(store: Store, kw: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        store.prune_events(**kw)


def test_concurrent_appends_keep_ids_unique_and_increasing(store: Store) -> None:
    per_thread: dict[int, list[int]] = {}

    def worker(n: int) -> None:
        ids: list[int] = []
        for i in range(50):
            if i % 2:
                ids.extend(e.id for e in store.append_events([("t", {"w": n}, None, None)] * 3))
            else:
                ids.append(store.append_event("t", {"w": n}).id)
        per_thread[n] = ids

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_ids = [i for ids in per_thread.values() for i in ids]
    assert len(all_ids) == len(set(all_ids)) == 6 * (25 + 25 * 3)
    for ids in per_thread.values():
        assert ids == sorted(ids)  # each thread sees its own ids increase
    stored = store.events_since(0)
    assert [e.id for e in stored] == list(range(1, len(all_ids) + 1))
    assert {e.id: e.data["w"] for e in stored} == {i: n for n, ids in per_thread.items() for i in ids}
