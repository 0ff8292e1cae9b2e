"""Grants: narrowing-only; widening needs a consent id never seen for the origin."""

from __future__ import annotations

import pytest
from core_support import FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from relay_jupyter.core.errors import Code, GateRefusal, RoutingRefusal
from relay_jupyter.core.grants import GrantBook, widens
from relay_jupyter.core.memory import MemoryGrantStore
from relay_jupyter.core.types import Budget, Grant

HYPO = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

BASE = Grant(origin="nb", tools=frozenset({"a", "b"}), models=frozenset({"m1"}),
             budget=Budget(requests_per_minute=10, tokens_per_day=1000, cost_per_day_usd=1.0,
                           max_steps_per_run=5, max_tokens_per_run=500),
             expires_at=2_000_000_000.0, consent_id="c1")


def book_with(grant: Grant = BASE, clock: FakeClock | None = None) -> GrantBook:
    book = GrantBook(MemoryGrantStore(), clock or FakeClock(), cache_ttl=0)
    book.issue(grant)
    return book


def test_get_returns_live_grant_and_hides_expired():
    clock = FakeClock(1_999_999_999.0)
    book = book_with(clock=clock)
    assert book.get("nb") == BASE
    assert [g.origin for g in book.list()] == ["nb"]
    clock.advance(1)
    assert book.get("nb") is None and book.list() == []
    assert book.get("other") is None


@pytest.mark.parametrize("change, what", [
    ({"tools": frozenset({"a", "b", "c"})}, "tools"),
    ({"tools": frozenset({"*"})}, "tools"),
    ({"models": frozenset({"m1", "m2"})}, "models"),
    ({"budget": BASE.budget.model_copy(update={"tokens_per_day": 1001})}, "budget"),
    ({"budget": BASE.budget.model_copy(update={"cost_per_day_usd": None})}, "budget"),
    ({"expires_at": None}, "expiry"),
    ({"expires_at": 2_000_000_001.0}, "expiry"),
])
def test_widening_with_same_consent_is_refused(change, what):
    book = book_with()
    with pytest.raises(GateRefusal) as ei:
        book.issue(BASE.model_copy(update=change))
    assert ei.value.code is Code.WIDENING_REFUSED and what in ei.value.data["widens"]
    assert book.get("nb") == BASE  # nothing changed
    if None not in change.values():  # narrow() reads None as "leave unchanged"
        with pytest.raises(GateRefusal) as ei:
            book.narrow("nb", **change)
        assert ei.value.code is Code.WIDENING_REFUSED


def test_widening_with_fresh_consent_is_accepted_and_old_consent_cannot_be_replayed():
    book = book_with()
    wide = BASE.model_copy(update={"tools": frozenset({"*"}), "consent_id": "c2"})
    assert book.issue(wide) == wide
    narrow = wide.model_copy(update={"tools": frozenset({"a"}), "consent_id": "c3"})
    book.issue(narrow)
    # c1 and c2 were seen for this origin: replaying either cannot widen again
    for old in ("c1", "c2"):
        with pytest.raises(GateRefusal):
            book.issue(wide.model_copy(update={"consent_id": old}))


def test_seen_consents_are_loaded_from_the_store():
    store = MemoryGrantStore()
    store.put_grant(BASE)
    book = GrantBook(store, FakeClock(), cache_ttl=0)
    with pytest.raises(GateRefusal):
        book.issue(BASE.model_copy(update={"models": frozenset({"*"})}))


def test_expired_grant_still_blocks_a_widening_replay():
    clock = FakeClock(2_000_000_000.0)  # BASE has just expired
    book = book_with(clock=clock)
    assert book.get("nb") is None
    with pytest.raises(GateRefusal):
        book.issue(BASE.model_copy(update={"expires_at": 2_100_000_000.0}))


def test_narrow_keeps_consent_and_refuses_widening():
    book = book_with()
    g = book.narrow("nb", tools=["a"], budget=BASE.budget.model_copy(update={"tokens_per_day": 10}),
                    expires_at=1_900_000_000.0)
    assert g.tools == {"a"} and g.consent_id == "c1" and g.budget.tokens_per_day == 10
    with pytest.raises(GateRefusal):
        book.narrow("nb", tools=["a", "b"])
    with pytest.raises(RoutingRefusal) as ei:
        book.narrow("ghost", tools=[])
    assert ei.value.code is Code.NOT_FOUND


def test_star_narrows_to_a_set():
    book = book_with(BASE.model_copy(update={"tools": frozenset({"*"})}))
    assert book.narrow("nb", tools={"x", "y"}).tools == {"x", "y"}


def test_revoke():
    book = book_with()
    assert book.revoke("nb") is True and book.get("nb") is None and book.revoke("nb") is False


def test_cache_ttl_bounds_staleness_of_an_outside_revoke():
    store, mono = MemoryGrantStore(), FakeClock(0.0)
    book = GrantBook(store, FakeClock(), cache_ttl=1.0, monotonic=mono)
    book.issue(BASE)
    assert book.get("nb") == BASE
    store.delete_grant("nb")  # another process revokes
    mono.advance(1.0)
    assert book.get("nb") is None


def test_bad_input():
    book = book_with()
    with pytest.raises(TypeError):
        book.issue({"origin": "x", "consent_id": "c"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        book.narrow("nb", tools="ab")
    with pytest.raises(ValidationError):
        book.narrow("nb", tools=[1, 2])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        Grant(origin="x")  # no consent id
    with pytest.raises(ValidationError):
        Grant(origin="x", consent_id="c", surprise=1)


# ---- Hypothesis: narrowing -------------------------------------------------------------
names = st.frozensets(st.sampled_from(["a", "b", "c", "d", "*"]), max_size=4)
limits = st.one_of(st.none(), st.integers(0, 2000))
budgets = st.builds(Budget, requests_per_minute=st.one_of(st.none(), st.floats(1, 100)), tokens_per_day=limits,
                    cost_per_day_usd=st.one_of(st.none(), st.floats(0, 5)), max_steps_per_run=limits,
                    max_tokens_per_run=limits)
grants = st.builds(Grant, origin=st.just("nb"), tools=names, models=names, budget=budgets,
                   expires_at=st.one_of(st.none(), st.floats(1.9e9, 2.1e9)), consent_id=st.just("c1"))


@HYPO
@given(old=grants, new=grants)
def test_property_same_consent_widening_always_refused_narrowing_always_accepted(old, new):
    book = book_with(old, FakeClock(1.0e9))
    if widens(new, old):
        with pytest.raises(GateRefusal) as ei:
            book.issue(new)
        assert ei.value.code is Code.WIDENING_REFUSED
        assert book.get("nb") == old
    else:
        assert book.issue(new) == new
        assert book.get("nb") == new


@HYPO
@given(old=grants, new=grants)
def test_property_widens_matches_set_and_limit_semantics(old, new):
    """An independent restatement: new is narrower iff it allows nothing old did not."""
    def covered(a: frozenset, b: frozenset) -> bool:
        return "*" in b or ("*" not in a and a <= b)
    narrower = (
        covered(new.tools, old.tools) and covered(new.models, old.models)
        and all(getattr(old.budget, f) is None or (getattr(new.budget, f) is not None
                and getattr(new.budget, f) <= getattr(old.budget, f)) for f in Budget.model_fields)
        and (old.expires_at is None or (new.expires_at is not None and new.expires_at <= old.expires_at))
    )
    assert narrower == (not widens(new, old))


def test_revoke_racing_a_read_never_leaves_a_stale_cache_entry():
    """A read that fetched the grant before a revoke must not cache it after the revoke."""
    import threading

    revoked = threading.Event()

    class SlowStore(MemoryGrantStore):
        def get_grant(self, origin):
            grant = super().get_grant(origin)
            if threading.current_thread().name == "reader":
                book.revoke(origin)  # the write lands between the read and the cache fill
                revoked.set()
            return grant

    store = SlowStore()
    store.put_grant(BASE)
    book = GrantBook(store, FakeClock(), cache_ttl=3600)
    t = threading.Thread(target=book.get, args=("nb",), name="reader")
    t.start()
    t.join()
    assert revoked.is_set()
    assert book.get("nb") is None  # served from the store, not a stale cache entry


def test_revoked_grant_cannot_be_resurrected_with_its_old_consent():
    book = book_with()
    book.revoke("nb")
    with pytest.raises(GateRefusal) as ei:
        book.issue(BASE)
    assert ei.value.code is Code.WIDENING_REFUSED and ei.value.data["widens"] == ["created"]
    assert book.issue(BASE.model_copy(update={"consent_id": "c-fresh"})).consent_id == "c-fresh"
    # another origin is unaffected by this origin's history
    assert book.issue(BASE.model_copy(update={"origin": "other"})).origin == "other"
