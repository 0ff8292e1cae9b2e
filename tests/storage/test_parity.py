"""The durable store behaves like the in-memory reference ports of core/memory.py on the same calls."""

from __future__ import annotations

from typing import Any

import pytest

from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.core.types import Grant
from relay_jupyter.storage import Store


def _scenario(s: Any, clock) -> dict[str, Any]:
    s.put_grant(Grant(origin="b", tools=frozenset({"t"}), consent_id="c", created_at=1.0))
    s.put_grant(Grant(origin="a", consent_id="c", created_at=1.0))
    s.add_usage("a", "2026-01-01", 5, 0.25)
    s.add_usage("a", "2026-01-01", 7, 0.5)
    first = s.append_event("x", {"n": 1}, origin="a", run_id="r")
    batch = s.append_events([("y", {"n": 2}, None, None), ("z", {"n": [3]}, "b", "r")])
    s.run_started("r1", "a", "c", {"m": 1})
    s.run_started("r2", "b", "c", {})
    s.call_intent("r1", "k1", "t", {"x": 1})
    s.call_intent("r1", "k2", "t", {"x": 2})
    s.call_outcome("r1", "k1", {"ok": True})
    clock.advance(1)
    s.run_finished("r1", "done", {"z": 2})
    out = {
        "grants": [g.origin for g in s.list_grants()],
        "grant": s.get_grant("b"),
        "deleted": (s.delete_grant("a"), s.delete_grant("a"), s.get_grant("a")),
        "usage": (s.usage("a", "2026-01-01"), s.usage("a", "2026-01-02")),
        "appended": [first, *batch],
        "since": [s.events_since(k) for k in (-5, 0, 1, 3, 99)],
        "limit": s.events_since(0, limit=2),
        "last": s.last_event_id(),
        "unfinished": s.unfinished_runs(),
        "no_outcome": [(c["call_id"], c["arguments"]) for c in s.calls_without_outcome("r1")],
        "runs": [(r["run_id"], r["state"], r["meta"], r["finished_at"]) for r in s.list_runs()],
        "runs_b": [r["run_id"] for r in s.list_runs(origin="b", limit=5)],
    }
    with pytest.raises(KeyError):
        s.run_finished("nope", "done")
    with pytest.raises(KeyError):
        s.call_outcome("r1", "nope", {})
    with pytest.raises(ValueError):
        s.add_usage("a", "d", -1, 0.0)
    return out


def test_same_results_as_the_reference(store: Store, clock) -> None:
    ref_clock = type(clock)(clock.now)
    expected = _scenario(MemoryStore(ref_clock), ref_clock)
    assert _scenario(store, clock) == expected
