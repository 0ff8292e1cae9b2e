"""The gate: docs/gate.md §1 order, each refusal at its step, later steps never reached, every decision audited."""

from __future__ import annotations

import asyncio

import pytest
from core_support import Rig, make_rig
from pydantic import ValidationError

from relay_jupyter.core.consent import StaticConsent
from relay_jupyter.core.errors import Code, GateRefusal, WorkspaceRefusal
from relay_jupyter.core.types import (
    AuditRecord,
    Budget,
    ConsentDecision,
    ConsentRequest,
    ConsentResult,
    Grant,
    PermissionMode,
    ToolClass,
    ToolRequest,
    ToolSpec,
    Usage,
)

ORIGIN = "notebook:a.ipynb#k1"
READ = ToolSpec(name="scratch_read", tool_class=ToolClass.READ)
CONTAINED = ToolSpec(name="scratch_edit", tool_class=ToolClass.CONTAINED)
WRITE = ToolSpec(name="fs__write", server="fs")
MODEL = "claude-sonnet-4-5"


def give(rig: Rig, **kw) -> Grant:
    data = {"origin": ORIGIN, "tools": frozenset({"scratch_read", "scratch_edit", "fs__write"}),
            "models": frozenset({"claude-sonnet-4-5"}), "consent_id": "c1",
            "budget": Budget(requests_per_minute=100)}
    data.update(kw)
    return rig.book.issue(Grant(**data))


def req(tool: ToolSpec = READ, **kw) -> ToolRequest:
    return ToolRequest(**{"origin": ORIGIN, "tool": tool, "call_id": "call-1", "run_id": "run-1",
                          "arguments": {"path": "a.txt"}, **kw})


class Executor:
    def __init__(self, result="done", exc: BaseException | None = None) -> None:
        self.calls = 0
        self.result, self.exc = result, exc

    async def __call__(self):
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return self.result


class NeverAnswers:
    def __init__(self) -> None:
        self.asked: list[ConsentRequest] = []
        self.started = asyncio.Event()

    async def ask(self, request: ConsentRequest) -> ConsentResult:
        self.asked.append(request)
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def last(rig: Rig):
    return rig.audit.records[-1]


async def refused(rig: Rig, r: ToolRequest, consent, code: Code) -> Executor:
    ex = Executor()
    with pytest.raises(GateRefusal) as ei:
        async with asyncio.timeout(5):
            await rig.gate.call_tool(r, ex, consent)
    assert ei.value.code is code
    assert ex.calls == 0
    rec = last(rig)
    assert (rec.decision, rec.code, rec.origin, rec.tool, rec.call_id, rec.run_id) == (
        "deny", code.value, ORIGIN, r.tool.name, "call-1", "run-1")
    return ex


# ---- step 1: grant ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_no_grant_is_unauthorized_and_never_asks(rig):
    consent = StaticConsent(ConsentDecision.ALLOW)
    await refused(rig, req(WRITE), consent, Code.UNAUTHORIZED)
    assert consent.asked == [] and len(rig.audit.records) == 1


@pytest.mark.asyncio
async def test_expired_grant_is_unauthorized(rig):
    give(rig, expires_at=rig.clock() + 10)
    rig.clock.advance(10)
    await refused(rig, req(), StaticConsent("allow"), Code.UNAUTHORIZED)


@pytest.mark.asyncio
async def test_other_origins_grant_does_not_count(rig):
    give(rig, origin="notebook:b.ipynb#k2")
    await refused(rig, req(), StaticConsent("allow"), Code.UNAUTHORIZED)


# ---- step 2: scope ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_tool_outside_grant_is_scope_exceeded_and_spends_no_rate(rig):
    give(rig, tools=frozenset({"scratch_read"}), budget=Budget(requests_per_minute=5))
    consent = StaticConsent("allow")
    await refused(rig, req(WRITE), consent, Code.SCOPE_EXCEEDED)
    assert consent.asked == []
    assert rig.ledger.usage(ORIGIN)["rpm_available"] is None  # no bucket was ever touched


# ---- step 3: rate -------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_rate_exceeded_before_consent(rig):
    give(rig, budget=Budget(requests_per_minute=2))
    ok = Executor()
    await rig.gate.call_tool(req(), ok, StaticConsent("deny"))
    await rig.gate.call_tool(req(CONTAINED), ok, StaticConsent("deny"))
    consent = StaticConsent("allow")
    await refused(rig, req(WRITE), consent, Code.BUDGET_EXCEEDED)
    assert consent.asked == [] and ok.calls == 2
    rig.mono.advance(30)
    await rig.gate.call_tool(req(), ok, consent)


# ---- step 4: class and consent ------------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.parametrize("tool", [READ, CONTAINED])
@pytest.mark.parametrize("mode", list(PermissionMode))
async def test_read_and_contained_run_without_consent(rig, tool, mode):
    give(rig)
    consent = StaticConsent("deny")
    assert await rig.gate.call_tool(req(tool, mode=mode), Executor(42), consent) == 42
    assert consent.asked == []
    rec = last(rig)
    assert (rec.decision, rec.tool_class, rec.answered_by) == ("allow", tool.tool_class, f"class:{tool.tool_class}")


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", [PermissionMode.ASK, PermissionMode.REVIEW])
async def test_write_asks_and_runs_when_allowed(rig, mode):
    give(rig)
    consent = StaticConsent("allow", answered_by="user:alice")
    assert await rig.gate.call_tool(req(WRITE, mode=mode, originator="client-7"), Executor("w"), consent) == "w"
    (asked,) = consent.asked
    assert asked.request.call_id == "call-1" and asked.request.originator == "client-7"
    assert asked.deadline == rig.clock() + rig.gate.consent_timeout
    rec = last(rig)
    assert (rec.decision, rec.tool_class, rec.answered_by) == ("allow", ToolClass.WRITE, "user:alice")


@pytest.mark.asyncio
async def test_write_denied(rig):
    give(rig)
    await refused(rig, req(WRITE), StaticConsent("deny", answered_by="user:bob"), Code.CONSENT_DENIED)
    assert last(rig).answered_by == "user:bob" and last(rig).tool_class is ToolClass.WRITE


@pytest.mark.asyncio
async def test_write_timeout_answer(rig):
    give(rig)
    await refused(rig, req(WRITE), StaticConsent(ConsentDecision.TIMEOUT), Code.PERMISSION_TIMEOUT)


@pytest.mark.asyncio
async def test_port_that_overruns_is_permission_timeout():
    rig = make_rig(consent_timeout=0.05)
    give(rig)
    port = NeverAnswers()
    await refused(rig, req(WRITE), port, Code.PERMISSION_TIMEOUT)
    assert len(port.asked) == 1 and last(rig).answered_by == "timeout"


@pytest.mark.asyncio
async def test_broken_or_malformed_port_denies(rig):
    give(rig)

    class Raises:
        async def ask(self, request):
            raise RuntimeError("widget crashed")

    class Junk:
        async def ask(self, request):
            return {"decision": "allow"}

    await refused(rig, req(WRITE), Raises(), Code.CONSENT_DENIED)
    assert last(rig).answered_by == "error:RuntimeError"
    await refused(rig, req(WRITE), Junk(), Code.CONSENT_DENIED)
    assert last(rig).answered_by == "error:malformed"


@pytest.mark.asyncio
async def test_full_mode_runs_writes_without_asking(rig):
    give(rig)
    consent = StaticConsent("deny")
    assert await rig.gate.call_tool(req(WRITE, mode=PermissionMode.FULL), Executor(1), consent) == 1
    assert consent.asked == [] and last(rig).answered_by == "mode:full"


@pytest.mark.asyncio
async def test_destructive_hint_makes_a_read_spec_ask(rig):
    give(rig)
    sneaky = ToolSpec(name="scratch_read", tool_class=ToolClass.READ, hints={"destructive_hint": True})
    await refused(rig, req(sneaky), StaticConsent("deny"), Code.CONSENT_DENIED)
    assert last(rig).tool_class is ToolClass.WRITE


@pytest.mark.asyncio
async def test_read_only_hint_does_not_skip_consent(rig):
    give(rig)
    liar = WRITE.model_copy(update={"hints": {"read_only_hint": True}})
    await refused(rig, req(liar), StaticConsent("deny"), Code.CONSENT_DENIED)


# ---- step 5: execute and audit ------------------------------------------------------------------

@pytest.mark.asyncio
async def test_execute_error_is_audited_and_reraised(rig):
    give(rig)
    with pytest.raises(ZeroDivisionError):
        await rig.gate.call_tool(req(), Executor(exc=ZeroDivisionError()), StaticConsent("deny"))
    assert [(r.decision, r.code) for r in rig.audit.records] == [("allow", None), ("error", "TOOL_ERROR")]
    with pytest.raises(WorkspaceRefusal):
        await rig.gate.call_tool(req(), Executor(exc=WorkspaceRefusal(Code.PATH_REFUSED, "no")), StaticConsent("deny"))
    assert (last(rig).decision, last(rig).code) == ("error", "PATH_REFUSED")


@pytest.mark.asyncio
async def test_cancel_while_waiting_for_consent_is_audited(rig):
    give(rig)
    port = NeverAnswers()
    ex = Executor()
    task = asyncio.create_task(rig.gate.call_tool(req(WRITE), ex, port))
    async with asyncio.timeout(5):
        await port.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ex.calls == 0
    assert (last(rig).decision, last(rig).code) == ("cancelled", "CANCELLED")


@pytest.mark.asyncio
async def test_cancel_while_executing_is_audited(rig):
    give(rig)
    started = asyncio.Event()

    async def slow():
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(rig.gate.call_tool(req(), slow, StaticConsent("deny")))
    async with asyncio.timeout(5):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.decision for r in rig.audit.records] == ["allow", "cancelled"]


@pytest.mark.asyncio
async def test_audit_failure_means_the_tool_does_not_run(rig):
    give(rig)

    def boom(record):
        raise OSError("audit disk full")

    rig.audit.append = boom  # type: ignore[method-assign]
    ex = Executor()
    with pytest.raises(OSError):
        await rig.gate.call_tool(req(), ex, StaticConsent("allow"))
    assert ex.calls == 0


@pytest.mark.asyncio
async def test_audit_record_fields(rig):
    give(rig)
    rig.clock.advance(5)
    await rig.gate.call_tool(req(arguments={"path": "a.txt", "api_key": "k-123"}), Executor(), StaticConsent("deny"))
    rec = last(rig)
    assert rec.ts == rig.clock() and rec.seq == 1 and rec.duration_ms >= 0
    assert rec.arguments == {"path": "a.txt", "api_key": "<masked>"}


@pytest.mark.asyncio
async def test_fast_audit_records_equal_validated_ones(rig):
    """The gate's records round-trip through JSON unchanged (fields and the fields set)."""
    give(rig)
    await rig.gate.call_tool(req(), Executor(), StaticConsent("deny"))
    with pytest.raises(GateRefusal):
        await rig.gate.call_tool(req(WRITE), Executor(), StaticConsent("deny"))
    rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=5).release()
    for rec in rig.audit.records:
        again = AuditRecord.model_validate_json(rec.model_dump_json())
        assert again == rec and again.model_fields_set == rec.model_fields_set
        assert rec.model_dump() == again.model_dump()


# ---- model requests -----------------------------------------------------------------------------


def test_completion_needs_grant_and_model(rig):
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=10)
    assert ei.value.code is Code.UNAUTHORIZED
    give(rig)
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, "claude-opus-4-1", estimated_tokens=10)
    assert ei.value.code is Code.SCOPE_EXCEEDED and "claude-opus-4-1" in ei.value.message
    assert [(r.tool, r.decision, r.code) for r in rig.audit.records] == [
        (f"model:{MODEL}", "deny", "UNAUTHORIZED"), ("model:claude-opus-4-1", "deny", "SCOPE_EXCEEDED")]


def test_completion_reserve_and_settle(rig):
    give(rig)
    run = rig.gate.run_budget(ORIGIN)
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1000, run=run)
    assert res.cost_usd == pytest.approx(rig.pricing.estimate(MODEL, 1000))
    assert rig.ledger.usage(ORIGIN)["reserved_tokens"] == 1000
    usage = Usage(input_tokens=400, output_tokens=100, cache_read_input_tokens=50)
    cost = rig.gate.settle_completion(res, MODEL, usage, run)
    assert cost == pytest.approx(rig.pricing.cost(MODEL, usage))
    assert rig.gate.settle_completion(res, MODEL, usage, run) == cost  # idempotent
    u = rig.ledger.usage(ORIGIN)
    assert (u["tokens"], u["reserved_tokens"], run.steps, run.tokens) == (550, 0, 1, 550)
    assert [r.decision for r in rig.audit.records] == ["allow", "settled"]


def test_completion_run_caps(rig):
    give(rig, budget=Budget(requests_per_minute=None, max_steps_per_run=1, max_tokens_per_run=500))
    run = rig.gate.run_budget(ORIGIN)
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=501, run=run)
    assert ei.value.data["limit"] == "max_tokens_per_run" and run.steps == 0
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=100, run=run)
    rig.gate.settle_completion(res, MODEL, Usage(output_tokens=100), run)
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1, run=run)
    assert ei.value.data["limit"] == "max_steps_per_run"
    assert rig.ledger.usage(ORIGIN)["reserved_tokens"] == 0


def test_completion_day_budget_and_rate(rig):
    give(rig, budget=Budget(requests_per_minute=3, tokens_per_day=1000, cost_per_day_usd=None))
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=900)
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=200)
    assert ei.value.data["limit"] == "tokens_per_day"
    res.release()
    rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=200)
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1)
    assert ei.value.data["limit"] == "requests_per_minute"


def test_unknown_model_reserves_at_the_worst_rate(rig):
    give(rig, models=frozenset({"*"}), budget=Budget(requests_per_minute=None, cost_per_day_usd=0.07))
    with pytest.raises(GateRefusal) as ei:  # 1000 tokens at the worst known rate ($75/MTok) > $0.07
        rig.gate.begin_completion(ORIGIN, "mystery-model", estimated_tokens=1000)
    assert ei.value.data["limit"] == "cost_per_day_usd"


def test_run_budget_needs_a_grant(rig):
    with pytest.raises(GateRefusal) as ei:
        rig.gate.run_budget(ORIGIN)
    assert ei.value.code is Code.UNAUTHORIZED
    give(rig, budget=Budget(max_steps_per_run=3, max_tokens_per_run=None))
    rb = rig.gate.run_budget(ORIGIN)
    assert (rb.max_steps, rb.max_tokens) == (3, None)


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_bad_input_to_call_tool(rig):
    give(rig)
    with pytest.raises(ValidationError):
        await rig.gate.call_tool({"origin": ORIGIN, "tool": {"name": "x"}}, Executor(), StaticConsent("allow"))
    with pytest.raises(ValidationError):
        await rig.gate.call_tool({**req().model_dump(), "extra": 1}, Executor(), StaticConsent("allow"))
    # a well-formed dict is accepted (validated into a ToolRequest)
    assert await rig.gate.call_tool(req().model_dump(), Executor(7), StaticConsent("deny")) == 7
    with pytest.raises(TypeError):
        await rig.gate.call_tool(req(), "not callable", StaticConsent("allow"))  # type: ignore[arg-type]


def test_bad_input_to_completions(rig):
    give(rig)
    with pytest.raises(ValueError):
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=-1)
    with pytest.raises(ValueError):
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rig.gate.begin_completion(ORIGIN, "", estimated_tokens=1)
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1)
    with pytest.raises(TypeError):
        rig.gate.settle_completion("res", MODEL, Usage())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        rig.gate.settle_completion(res, MODEL, {"input_tokens": "lots"})  # type: ignore[arg-type]
    assert rig.gate.settle_completion(res, MODEL, {"input_tokens": 3}) > 0  # type: ignore[arg-type]


def test_bad_gate_config(rig):
    from relay_jupyter.core.gate import Gate
    with pytest.raises(ValueError):
        Gate(grants=rig.book, ledger=rig.ledger, audit=rig.audit, pricing=rig.pricing, consent_timeout=0)


def test_allowed_tools_is_the_grant_filter_and_fails_closed():
    from relay_jupyter.core.budgets import BudgetLedger
    from relay_jupyter.core.gate import Gate
    from relay_jupyter.core.grants import GrantBook
    from relay_jupyter.core.memory import MemoryAuditSink, MemoryGrantStore, MemoryLedger
    from relay_jupyter.core.pricing import Pricing
    from relay_jupyter.core.types import Grant

    book = GrantBook(MemoryGrantStore(), cache_ttl=0)
    gate = Gate(grants=book, ledger=BudgetLedger(MemoryLedger()), audit=MemoryAuditSink(), pricing=Pricing())
    assert gate.allowed_tools("notebook:a", ["x", "y"]) == []  # no grant: nothing
    book.issue(Grant(origin="notebook:a", tools=frozenset({"y", "z"}), consent_id="c1"))
    assert gate.allowed_tools("notebook:a", ["x", "y", "z"]) == ["y", "z"]
    book.issue(Grant(origin="notebook:b", tools=frozenset({"*"}), consent_id="c2"))
    assert gate.allowed_tools("notebook:b", ["x", "y"]) == ["x", "y"]
    book.revoke("notebook:a")
    assert gate.allowed_tools("notebook:a", ["y"]) == []


def test_run_caps_follow_a_grant_narrowed_mid_run(rig):
    """A run's caps are the stricter of those at its start and those of the live grant now: narrowing
    the grant (the user reining in a runaway run) takes effect at the run's next request."""
    give(rig, budget=Budget(requests_per_minute=None, max_steps_per_run=10, max_tokens_per_run=10_000))
    run = rig.gate.run_budget(ORIGIN)
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=100, run=run)
    rig.gate.settle_completion(res, MODEL, Usage(output_tokens=100), run)
    rig.book.narrow(ORIGIN, budget=Budget(requests_per_minute=None, max_steps_per_run=1, max_tokens_per_run=10_000))
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=1, run=run)
    assert ei.value.data["limit"] == "max_steps_per_run"
    run2 = rig.gate.run_budget(ORIGIN)
    rig.book.narrow(ORIGIN, budget=Budget(requests_per_minute=None, max_steps_per_run=1, max_tokens_per_run=50))
    with pytest.raises(GateRefusal) as ei:
        rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=51, run=run2)
    assert ei.value.data["limit"] == "max_tokens_per_run"
    assert (run2.max_steps, run2.max_tokens) == (1, 50)
    assert rig.ledger.usage(ORIGIN)["reserved_tokens"] == 0


# ---- settling: reported usage is judged against the request's bound ----------------------------------

def _settled(rig: Rig) -> dict:
    (rec,) = [r for r in rig.audit.records if r.decision == "settled"]
    return rec.arguments


def _begin(rig: Rig, input_tokens: int = 400, max_output: int = 100):
    from relay_jupyter.core.budgets import RequestEstimate

    give(rig, budget=Budget(requests_per_minute=None, tokens_per_day=10_000, cost_per_day_usd=1.0))
    est = RequestEstimate(input_tokens=input_tokens, max_output=max_output)
    res = rig.gate.begin_completion(ORIGIN, MODEL, estimate=est)
    return res


def test_reservation_from_an_estimate_prices_input_and_output_apart(rig):
    res = _begin(rig)
    p = rig.pricing.price(MODEL)
    assert res.tokens == 500
    assert res.cost_usd == pytest.approx((400 * max(p.input, p.cache_write, p.cache_read) + 100 * p.output) / 1e6)
    (allow,) = rig.audit.records
    assert allow.arguments["estimated_input_tokens"] == 400 and allow.arguments["max_output_tokens"] == 100


@pytest.mark.parametrize("usage", [Usage(input_tokens=10**12, output_tokens=10**12), Usage(input_tokens=-50),
                                   Usage(input_tokens=300, output_tokens=-1), Usage(output_tokens=101)])
def test_absurd_usage_is_clamped_to_the_reservation_and_flagged(rig, usage):
    res = _begin(rig)
    run = rig.gate.run_budget(ORIGIN)
    cost = rig.gate.settle_completion(res, MODEL, usage, run)
    u = rig.ledger.usage(ORIGIN)
    assert (u["tokens"], u["reserved_tokens"], run.tokens) == (500, 0, 500)
    assert cost == pytest.approx(res.cost_usd) and u["cost_usd"] == pytest.approx(res.cost_usd)
    args = _settled(rig)
    assert args["basis"] == "clamped" and args["reported"]["input_tokens"] == usage.input_tokens
    # not locked out for the day: the next request still fits
    rig.gate.begin_completion(ORIGIN, MODEL, estimated_tokens=100).release()


def test_no_usage_is_charged_an_estimate_and_audited_so(rig):
    res = _begin(rig)
    cost = rig.gate.settle_completion(res, MODEL, None, streamed_output_tokens=30)
    assert rig.ledger.usage(ORIGIN)["tokens"] == 430
    assert cost == pytest.approx(rig.pricing.bound(MODEL, 400, 30))
    assert _settled(rig) == {"tokens": 430, "cost_usd": round(cost, 6), "basis": "estimated"}


@pytest.mark.parametrize("outcome, tokens, basis", [("interrupted", 500, "reservation"),
                                                     ("not_started", 400, "input_estimate"),
                                                     ("refused", 0, "refused")])
def test_a_request_that_did_not_complete_is_charged_by_its_outcome(rig, outcome, tokens, basis):
    res = _begin(rig)
    rig.gate.settle_completion(res, MODEL, Usage(input_tokens=5, output_tokens=1), outcome=outcome)
    assert rig.ledger.usage(ORIGIN)["tokens"] == tokens
    args = _settled(rig)
    assert args["basis"] == basis and args["outcome"] == outcome and args["tokens"] == tokens


def test_reported_usage_within_bounds_is_charged_as_reported(rig):
    res = _begin(rig)
    usage = Usage(input_tokens=200, cache_creation_input_tokens=100, cache_read_input_tokens=100, output_tokens=100)
    cost = rig.gate.settle_completion(res, MODEL, usage)
    assert rig.ledger.usage(ORIGIN)["tokens"] == 500
    assert cost == pytest.approx(rig.pricing.cost(MODEL, usage)) and cost <= res.cost_usd
    assert _settled(rig)["basis"] == "reported"
