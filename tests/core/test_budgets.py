"""Budgets: rate bucket, reserve/settle under concurrency, per-run caps, the ledger never under-counts."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from core_support import FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_jupyter.core.budgets import BudgetLedger, RunBudget, TokenBucket, utc_day
from relay_jupyter.core.errors import Code, GateRefusal
from relay_jupyter.core.memory import MemoryLedger
from relay_jupyter.core.types import Budget, Grant

HYPO = settings(deadline=None, max_examples=30,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def grant(**budget) -> Grant:
    return Grant(origin="nb", tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c",
                 budget=Budget(**{"requests_per_minute": None, **budget}))


def test_token_bucket_refills_at_rate():
    mono = FakeClock(0.0)
    b = TokenBucket(6, clock=mono)  # one every 10 s, burst 6
    assert all(b.try_take() for _ in range(6)) and not b.try_take()
    assert b.retry_after() == pytest.approx(10.0)
    mono.advance(10)
    assert b.try_take() and not b.try_take()
    mono.advance(1000)
    assert b.available() == 6  # capped at capacity
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_take_request_refuses_past_the_rate():
    mono = FakeClock(0.0)
    led = BudgetLedger(MemoryLedger(), monotonic=mono)
    g = grant(requests_per_minute=2)
    led.take_request("nb", g)
    led.take_request("nb", g)
    with pytest.raises(GateRefusal) as ei:
        led.take_request("nb", g)
    assert ei.value.code is Code.BUDGET_EXCEEDED and ei.value.data["limit"] == "requests_per_minute"
    led.take_request("other", g)  # buckets are per origin
    mono.advance(30)
    led.take_request("nb", g)


def test_narrowed_rate_does_not_refill_the_bucket():
    mono = FakeClock(0.0)
    led = BudgetLedger(MemoryLedger(), monotonic=mono)
    for _ in range(10):
        led.take_request("nb", grant(requests_per_minute=10))
    with pytest.raises(GateRefusal):
        led.take_request("nb", grant(requests_per_minute=5))


def test_widened_rate_after_exhaustion_is_not_refused_at_once():
    """A run refused at 3/min, then a fresh grant allowing 30/min: the 3 requests of the last minute
    count against 30, they do not leave an empty bucket sized for 3."""
    mono = FakeClock(0.0)
    led = BudgetLedger(MemoryLedger(), monotonic=mono)
    for _ in range(3):
        led.take_request("nb", grant(requests_per_minute=3))
    with pytest.raises(GateRefusal):
        led.take_request("nb", grant(requests_per_minute=3))
    wide = grant(requests_per_minute=30)
    for _ in range(27):  # 30 per minute, minus the 3 already made
        led.take_request("nb", wide)
    with pytest.raises(GateRefusal) as ei:
        led.take_request("nb", wide)
    assert "30 requests per minute" in ei.value.message
    assert ei.value.data["retry_after"] == pytest.approx(2.0)  # refilled at the new rate: 60/30 s a request
    assert led.usage("nb", wide)["rpm_available"] == pytest.approx(0.0)


def test_reissue_at_the_same_rate_does_not_refill():
    mono = FakeClock(0.0)
    led = BudgetLedger(MemoryLedger(), monotonic=mono)
    for _ in range(5):
        led.take_request("nb", grant(requests_per_minute=5))
    # revoke + a new grant at the same limit: still the same recent requests, still empty
    with pytest.raises(GateRefusal):
        led.take_request("nb", grant(requests_per_minute=5.0))


def test_narrowing_keeps_what_was_used_and_never_refills():
    mono = FakeClock(0.0)
    led = BudgetLedger(MemoryLedger(), monotonic=mono)
    for _ in range(4):
        led.take_request("nb", grant(requests_per_minute=10))  # 6 left of 10
    assert led.usage("nb", grant(requests_per_minute=8))["rpm_available"] == pytest.approx(4.0)
    # a ladder of narrowings (no consent needed) cannot reset the rate: each keeps the 4 used
    for rpm in (7, 6, 5):
        assert led.usage("nb", grant(requests_per_minute=rpm))["rpm_available"] == pytest.approx(rpm - 4)
    led.take_request("nb", grant(requests_per_minute=5))
    with pytest.raises(GateRefusal):
        led.take_request("nb", grant(requests_per_minute=5))
    # narrowed below what was used: empty, not negative; back up (a fresh consent) gives only the difference
    assert led.usage("nb", grant(requests_per_minute=2))["rpm_available"] == pytest.approx(0.0)
    assert led.usage("nb", grant(requests_per_minute=10))["rpm_available"] == pytest.approx(8.0)


def test_rate_follows_the_grant_through_the_gate():
    """Revoke + fresh grant at a higher rate is usable at once; revoke + fresh grant at the same rate is not."""
    from core_support import make_rig

    from relay_jupyter.core.types import Grant

    rig = make_rig()

    def issue(consent: str, rpm: float) -> None:
        rig.book.revoke("nb")
        rig.book.issue(Grant(origin="nb", tools=frozenset({"*"}), models=frozenset({"*"}), consent_id=consent,
                             budget=Budget(requests_per_minute=rpm)))

    issue("c1", 3)
    for _ in range(3):
        rig.gate.begin_completion("nb", "claude-test", estimated_tokens=1).release()
    with pytest.raises(GateRefusal):
        rig.gate.begin_completion("nb", "claude-test", estimated_tokens=1)
    issue("c2", 3)
    with pytest.raises(GateRefusal):
        rig.gate.begin_completion("nb", "claude-test", estimated_tokens=1)
    issue("c3", 30)
    rig.gate.begin_completion("nb", "claude-test", estimated_tokens=1).release()


def test_reserve_settle_release():
    clock = FakeClock()
    port = MemoryLedger()
    led = BudgetLedger(port, clock=clock)
    g = grant(tokens_per_day=100, cost_per_day_usd=1.0)
    r1 = led.reserve("nb", g, tokens=60, cost_usd=0.1)
    with pytest.raises(GateRefusal) as ei:
        led.reserve("nb", g, tokens=41, cost_usd=0.1)  # 60 held + 41 > 100
    assert ei.value.data["limit"] == "tokens_per_day"
    r1.release()
    r2 = led.reserve("nb", g, tokens=100, cost_usd=0.1)
    r2.settle(120, 0.2)  # actual above the estimate: committed in full
    r2.settle(1, 1.0)  # idempotent
    r2.release()
    assert port.usage("nb", utc_day(clock())) == (120, 0.2)
    u = led.usage("nb", g)
    assert (u["tokens"], u["reserved_tokens"], u["tokens_limit"], u["cost_limit"]) == (120, 0, 100, 1.0)
    with pytest.raises(GateRefusal):
        led.reserve("nb", g, tokens=0, cost_usd=0.0)  # already over: 120 + 0 > 100
    with pytest.raises(GateRefusal) as ei:
        led.reserve("nb", grant(cost_per_day_usd=0.25), tokens=1, cost_usd=0.06)
    assert ei.value.data["limit"] == "cost_per_day_usd"


def test_day_rolls_over_at_utc_midnight():
    clock = FakeClock(1_800_057_599.0)  # 23:59:59 UTC
    led = BudgetLedger(MemoryLedger(), clock=clock)
    g = grant(tokens_per_day=10)
    led.reserve("nb", g, tokens=10, cost_usd=0).settle(10, 0)
    with pytest.raises(GateRefusal):
        led.reserve("nb", g, tokens=1, cost_usd=0)
    clock.advance(1)
    led.reserve("nb", g, tokens=10, cost_usd=0)


def test_settle_failure_keeps_the_hold():
    class Broken(MemoryLedger):
        def add_usage(self, *a):
            raise OSError("disk full")

    led = BudgetLedger(Broken())
    g = grant(tokens_per_day=10)
    r = led.reserve("nb", g, tokens=10, cost_usd=0)
    with pytest.raises(OSError):
        r.settle(5, 0)
    assert not r.done
    with pytest.raises(GateRefusal):  # the spend is still counted as in flight
        led.reserve("nb", g, tokens=1, cost_usd=0)


@pytest.mark.parametrize("tokens, cost", [(-1, 0.0), (1, -0.1), (1.5, 0.0), (True, 0.0), (1, float("nan")),
                                          (1, float("inf")), (1, "1")])
def test_bad_amounts(tokens, cost):
    led = BudgetLedger(MemoryLedger())
    with pytest.raises(ValueError):
        led.reserve("nb", grant(), tokens=tokens, cost_usd=cost)
    r = led.reserve("nb", grant(), tokens=0, cost_usd=0.0)
    with pytest.raises(ValueError):
        r.settle(tokens, cost)


def test_run_budget_caps():
    rb = RunBudget(max_steps=2, max_tokens=100)
    rb.step()
    rb.step()
    with pytest.raises(GateRefusal) as ei:
        rb.step()
    assert ei.value.data["limit"] == "max_steps_per_run" and rb.steps == 2
    rb.check_tokens(100)
    with pytest.raises(GateRefusal):
        rb.check_tokens(101)
    rb.add_tokens(150)  # actuals always count
    assert rb.tokens == 150
    with pytest.raises(GateRefusal):
        rb.check_tokens()
    with pytest.raises(ValueError):
        rb.add_tokens(-1)
    free = RunBudget(None, None)
    for _ in range(1000):
        free.step()
    free.check_tokens(10**12)


# ---- Hypothesis: 50 parallel reservations never overspend; the ledger never under-counts ----------

work = st.lists(st.tuples(st.integers(0, 400), st.integers(0, 400), st.booleans()), min_size=50, max_size=50)


def _limits_hold(port: MemoryLedger, day: str, g: Grant, settled: list[tuple[int, float]], led, over: bool) -> None:
    tokens, cost = port.usage("nb", day)
    # never under-counts: the ledger holds exactly the sum of the settled actuals
    assert tokens == sum(t for t, _ in settled)
    assert cost == pytest.approx(sum(c for _, c in settled))
    if not over:  # when actuals never exceed estimates, the limits are never passed
        assert tokens <= g.budget.tokens_per_day
        assert cost <= g.budget.cost_per_day_usd + 1e-9
    assert led.usage("nb", g)["reserved_tokens"] == 0


@HYPO
@given(items=work, limit=st.integers(0, 6000), over=st.booleans())
def test_property_threads_never_overspend(items, limit, over):
    clock = FakeClock()
    port = MemoryLedger()
    led = BudgetLedger(port, clock=clock)
    g = grant(tokens_per_day=limit, cost_per_day_usd=limit / 1000)
    settled: list[tuple[int, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(items))

    def one(est: int, actual: int, send: bool) -> None:
        barrier.wait()
        try:
            r = led.reserve("nb", g, tokens=est, cost_usd=est / 1000)
        except GateRefusal:
            return
        if not send:
            r.release()
            return
        used = actual if over else min(actual, est)
        r.settle(used, used / 1000)
        with lock:
            settled.append((used, used / 1000))

    threads = [threading.Thread(target=one, args=it) for it in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _limits_hold(port, utc_day(clock()), g, settled, led, over)


@HYPO
@given(items=work, limit=st.integers(0, 6000), over=st.booleans())
def test_property_asyncio_tasks_never_overspend(items, limit, over):
    clock = FakeClock()
    port = MemoryLedger()
    led = BudgetLedger(port, clock=clock)
    g = grant(tokens_per_day=limit, cost_per_day_usd=limit / 1000)
    settled: list[tuple[int, float]] = []

    async def one(est: int, actual: int, send: bool) -> None:
        await asyncio.sleep(0)
        try:
            r = led.reserve("nb", g, tokens=est, cost_usd=est / 1000)
        except GateRefusal:
            return
        await asyncio.sleep(0)  # the "request" is in flight while others reserve
        if not send:
            r.release()
            return
        used = actual if over else min(actual, est)
        r.settle(used, used / 1000)
        settled.append((used, used / 1000))

    async def main() -> None:
        async with asyncio.timeout(10):
            await asyncio.gather(*(one(*it) for it in items))

    asyncio.run(main())
    _limits_hold(port, utc_day(clock()), g, settled, led, over)


@pytest.mark.parametrize("budget", [{"cost_per_day_usd": float("nan")}, {"tokens_per_day": -1},
                                    {"cost_per_day_usd": -1.0}])
def test_nonsense_day_limits_fail_closed(budget):
    led = BudgetLedger(MemoryLedger())
    with pytest.raises(GateRefusal) as ei:
        led.reserve("nb", grant(**budget), tokens=0, cost_usd=0.0)
    assert ei.value.code is Code.BUDGET_EXCEEDED


@pytest.mark.parametrize("rpm", [0.0, -5.0, float("nan")])
def test_nonsense_rates_fail_closed(rpm):
    led = BudgetLedger(MemoryLedger())
    with pytest.raises(GateRefusal) as ei:
        led.take_request("nb", grant(requests_per_minute=rpm))
    assert ei.value.code is Code.BUDGET_EXCEEDED


def test_infinite_rate_is_unlimited():
    led = BudgetLedger(MemoryLedger())
    for _ in range(100):
        led.take_request("nb", grant(requests_per_minute=float("inf")))


def test_run_budget_bad_input():
    rb = RunBudget(max_steps=0, max_tokens=10)
    with pytest.raises(GateRefusal):
        rb.step()  # a zero cap allows no step
    with pytest.raises(ValueError):
        rb.check_tokens(-1)


# ---- request estimates: the whole request, conservatively ----------------------------------------

from relay_jupyter.core.budgets import (  # noqa: E402
    RequestEstimate,
    estimate_request,
    estimate_text_tokens,
    judge_usage,
)
from relay_jupyter.core.types import ToolSpec, Usage  # noqa: E402
from relay_jupyter.testing.scripted import count_request_tokens  # noqa: E402

TOOLS = [ToolSpec(name=f"tool_{i}", description="Reads a file of the notebook's workspace and returns it " * 3,
                  input_schema={"type": "object", "properties": {"path": {"type": "string", "description": "a path"},
                                                                 "max_bytes": {"type": "integer"}},
                                "required": ["path"]}) for i in range(12)]


def test_estimate_counts_system_tools_history_and_max_tokens():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    bare = estimate_request("", msgs, [], 16)
    with_system = estimate_request("You are helpful. " * 20, msgs, [], 16)
    with_tools = estimate_request("", msgs, TOOLS, 16)
    longer = estimate_request("", [*msgs, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "tool_1", "input": {"path": "x" * 300}}]}], [], 16)
    assert bare.max_output == 16 and bare.total == bare.input_tokens + 16
    for bigger in (with_system, with_tools, longer):
        assert bigger.input_tokens > bare.input_tokens
    # each tool's description and schema count (the measured defect: 118 reserved, 432 used)
    assert with_tools.input_tokens - bare.input_tokens >= sum(len(t.description) // 3 for t in TOOLS)
    with pytest.raises(ValueError):
        estimate_request("", msgs, [], -1)


def test_estimate_is_above_the_fake_servers_count_of_the_same_request():
    """The fakes report words of system + messages + tools as input usage: the estimate of the same
    request, as the broker sends it, is never below that (so honest fake usage is never clamped)."""
    system = "You are an assistant working inside a notebook. " * 5
    msgs = [{"role": "user", "content": [{"type": "text", "text": "please read a.txt and b.txt " * 10}]}]
    body = {"system": system, "messages": msgs,
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in TOOLS]}
    est = estimate_request(system, msgs, TOOLS, 16)
    assert est.input_tokens >= count_request_tokens(body)


@HYPO
@given(st.text(max_size=400))
def test_text_estimate_bounds(text):
    n = estimate_text_tokens(text)
    assert n >= len(text.split())  # never below one token a word
    assert n >= sum(c.isdigit() and c.isascii() for c in text)  # a digit is a token (Llama 2, Gemma)
    assert n <= len(text.encode("utf-8", "surrogatepass"))  # never above one token a byte
    non_ascii = sum(not c.isascii() for c in text)
    assert n >= non_ascii  # a CJK character or an emoji is at least one token


def test_text_estimate_values():
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abc") == 1
    assert estimate_text_tokens("abcd") == 2
    assert estimate_text_tokens("2026") == 4
    assert estimate_text_tokens("日本") == 5  # 2 extra bytes a character, plus 2 characters / 3
    assert estimate_text_tokens("😀") == 4


# ---- judging reported usage ---------------------------------------------------------------------------

EST = RequestEstimate(input_tokens=400, max_output=100)


@pytest.mark.parametrize("usage, basis, tokens", [
    (Usage(input_tokens=300, output_tokens=80), "reported", 380),
    (Usage(input_tokens=200, cache_read_input_tokens=150, output_tokens=100), "reported", 450),
    (Usage(input_tokens=10**12, output_tokens=10**12), "clamped", 500),
    (Usage(input_tokens=10**12), "clamped", 500),
    (Usage(input_tokens=300, output_tokens=-5), "clamped", 500),
    (Usage(input_tokens=-300, output_tokens=50), "clamped", 500),
    (Usage(input_tokens=401, output_tokens=1), "clamped", 500),  # input beyond the estimate
    (Usage(input_tokens=10, output_tokens=101), "clamped", 500),  # output beyond max_tokens
    (Usage(input_tokens=10, cache_creation_input_tokens=391), "clamped", 500),  # cache tokens are input
    (None, "estimated", 400 + 30),
    (Usage(), "estimated", 400 + 30),
])
def test_judge_usage(usage, basis, tokens):
    charge = judge_usage(EST.total, EST, usage, streamed_output_tokens=30)
    assert (charge.basis, charge.tokens) == (basis, tokens)
    assert charge.tokens <= EST.total
    if basis == "clamped":
        assert charge.usage is None and charge.reported == {
            "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens}


def test_judge_usage_outcomes():
    reported = Usage(input_tokens=10, output_tokens=1)
    assert judge_usage(500, EST, reported, outcome="interrupted").tokens == 500  # killed mid-stream
    assert judge_usage(500, EST, None, outcome="interrupted").basis == "reservation"
    assert judge_usage(500, EST, None, outcome="not_started").tokens == 400  # the prompt may have been read
    assert judge_usage(500, None, None, outcome="not_started").tokens == 500
    assert judge_usage(500, EST, None, outcome="refused").tokens == 0  # an HTTP error answer
    # streamed more than max_tokens could hold: capped at max_tokens
    assert judge_usage(500, EST, None, streamed_output_tokens=10**9).tokens == 500
    # no estimate (the reviewer's meter): bounded by the reservation as a whole
    assert judge_usage(50, None, Usage(input_tokens=20, output_tokens=20)).basis == "reported"
    assert judge_usage(50, None, Usage(input_tokens=40, output_tokens=20)).basis == "clamped"


# ---- holds in the SQLite store: shared by every connection and process ----------------------------------

def _store(path):
    from relay_jupyter.storage.sqlite import Store

    return Store.open(path)


def test_store_holds_reserve_settle_release_and_expiry(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "relay.db")
    led = BudgetLedger(store, clock=clock, hold_ttl=60)
    g = grant(tokens_per_day=100, cost_per_day_usd=1.0)
    day = utc_day(clock())
    r1 = led.reserve("nb", g, tokens=60, cost_usd=0.1)
    other = BudgetLedger(_store(tmp_path / "relay.db"), clock=clock, hold_ttl=60)  # a second broker
    assert other.usage("nb", g)["reserved_tokens"] == 60
    with pytest.raises(GateRefusal):
        other.reserve("nb", g, tokens=41, cost_usd=0.1)  # the other connection's hold counts
    r2 = other.reserve("nb", g, tokens=40, cost_usd=0.1)
    r2.settle(25, 0.05)
    assert store.usage("nb", day) == (25, pytest.approx(0.05)) and store.held("nb", day) == (60, pytest.approx(0.1))
    r1.release()
    assert store.held("nb", day) == (0, 0.0) and store.usage("nb", day)[0] == 25
    # a hold its broker never settles (it crashed) is charged in full once expired
    lost = other.reserve("nb", g, tokens=50, cost_usd=0.2)
    clock.advance(61)
    led.reserve("nb", g, tokens=1, cost_usd=0.0).release()  # any reservation sweeps first
    assert store.usage("nb", day) == (75, pytest.approx(0.25)) and store.held("nb", day)[0] == 0
    lost.settle(70, 0.3)  # a late settle adds only what exceeds the charged hold
    assert store.usage("nb", day) == (95, pytest.approx(0.35))
    assert store.query("SELECT COUNT(*) FROM budget_holds")[0][0] == 0


def test_store_settle_failure_keeps_the_hold(tmp_path):
    store = _store(tmp_path / "relay.db")
    led = BudgetLedger(store)
    g = grant(tokens_per_day=10)
    r = led.reserve("nb", g, tokens=10, cost_usd=0)
    store.close()  # the store fails (closed, full disk ...)
    with pytest.raises(Exception):
        r.settle(5, 0)
    assert not r.done
    led2 = BudgetLedger(_store(tmp_path / "relay.db"))
    with pytest.raises(GateRefusal):  # the hold is still in the file: still counted
        led2.reserve("nb", g, tokens=1, cost_usd=0)


def test_processes_sharing_a_store_never_overspend(tmp_path):
    """16 processes on one SQLite file, each reserving 100 and settling 100 (the most a request may be
    charged) against a day of 2,000: the ledger ends at exactly the limit, never above."""
    import subprocess
    import sys
    from pathlib import Path

    path, go = str(tmp_path / "relay.db"), str(tmp_path / "go")
    _store(path).close()
    script = str(Path(__file__).with_name("budget_hammer.py"))
    procs = [subprocess.Popen([sys.executable, script, path, "10", "100", "100", "2000", go],
                              stdout=subprocess.PIPE, text=True) for _ in range(16)]
    try:
        for p in procs:  # every process has its store open before any reserves: they all race
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert [p.returncode for p in procs] == [0] * 16
    settled = [t for out in outs for t in json.loads(out)]
    store = _store(path)
    tokens, _ = store.usage("nb", utc_day(__import__("time").time()))
    assert tokens == sum(settled) == 2000  # as much as fits, and not one token more
    assert store.held("nb", utc_day(__import__("time").time())) == (0, 0.0)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_hold_ports_agree(kind, tmp_path):
    """The in-memory ledger and the SQLite store keep holds the same way (core/memory.py is the reference)."""
    port = MemoryLedger() if kind == "memory" else _store(tmp_path / "relay.db")
    seen = []

    def check(*args):
        seen.append(args)

    a = port.hold("nb", "2027-01-01", 30, 0.3, now=100.0, expires_at=160.0, check=check)
    b = port.hold("nb", "2027-01-01", 20, 0.2, now=101.0, expires_at=161.0, check=check)
    assert seen == [(0, 0.0, 0, 0.0), (0, 0.0, 30, pytest.approx(0.3))]
    assert port.held("nb", "2027-01-01") == (50, pytest.approx(0.5)) and port.held("other", "2027-01-01") == (0, 0)

    def refuse(*args):
        raise GateRefusal(Code.BUDGET_EXCEEDED, "no")

    with pytest.raises(GateRefusal):
        port.hold("nb", "2027-01-01", 1, 0.0, now=102.0, expires_at=162.0, check=refuse)
    assert port.held("nb", "2027-01-01")[0] == 50  # a refused hold leaves nothing
    assert port.finish_hold(a, 10, 0.1) is True and port.finish_hold(a, 10, 0.1) is False  # once
    assert port.usage("nb", "2027-01-01") == (10, pytest.approx(0.1))
    assert port.sweep_holds(161.0) == 1  # b expired: charged in full
    assert port.usage("nb", "2027-01-01") == (30, pytest.approx(0.3)) and port.held("nb", "2027-01-01")[0] == 0
    assert port.finish_hold(b, 25, 0.25) is False  # late: adds the excess over the charged hold (5)
    assert port.usage("nb", "2027-01-01") == (35, pytest.approx(0.35))
    c = port.hold("nb", "2027-01-01", 5, 0.0, now=200.0, expires_at=300.0, check=check)
    assert port.finish_hold(c, None, None) is True and port.usage("nb", "2027-01-01")[0] == 35  # released
