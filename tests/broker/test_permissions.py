"""Permission routing: originator only, exactly one answer, late answers refused, finite timeout, scopes."""

from __future__ import annotations

import asyncio
import time

import pytest
from broker_callers import BROWSER, KERNEL_A, KERNEL_A2, KERNEL_B

from relay_jupyter.core.errors import Code, RoutingRefusal
from relay_jupyter.core.types import (
    ConsentDecision,
    ConsentRequest,
    ConsentScope,
    ToolClass,
    ToolRequest,
    ToolSpec,
)
from relay_jupyter.protocol.names import EventType

WRITE = ToolSpec(name="write_file", tool_class=ToolClass.WRITE)


def consent_request(rid="pr_1", *, tool=WRITE, run_id="run1", deadline_in=30.0):
    req = ToolRequest(origin=KERNEL_A.origin, tool=tool, arguments={"code": "1"}, call_id="c1", run_id=run_id,
                      originator=KERNEL_A.client_id)
    return ConsentRequest(request_id=rid, request=req, deadline=time.time() + deadline_in)


async def until_pending(router, n=1):
    async with asyncio.timeout(2):
        while len(router._pending) < n:
            await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_only_originator_answers(broker):
    router = broker.permissions
    task = asyncio.create_task(router.ask(consent_request()))
    await until_pending(router)
    for other in (KERNEL_B, KERNEL_A2):
        with pytest.raises(RoutingRefusal) as exc:
            router.answer(other, "pr_1", ConsentDecision.ALLOW, ConsentScope.ONCE)
        assert exc.value.code is Code.NOT_ORIGINATOR
    assert not task.done()
    result = router.answer(KERNEL_A, "pr_1", ConsentDecision.ALLOW, ConsentScope.ONCE)
    assert (await task) == result and result.answered_by == KERNEL_A.client_id
    events = [e.type for e in broker.store.events_since(0)]
    assert events == [EventType.PERMISSION_REQUEST, EventType.PERMISSION_RESOLVED]
    request_event = broker.store.events_since(0)[0]
    assert request_event.origin == KERNEL_A.origin and request_event.data["originator"] == KERNEL_A.client_id


@pytest.mark.asyncio
async def test_browser_of_owner_may_answer(broker):
    task = asyncio.create_task(broker.permissions.ask(consent_request()))
    await until_pending(broker.permissions)
    broker.permissions.answer(BROWSER, "pr_1", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await task).decision is ConsentDecision.DENY


@pytest.mark.asyncio
async def test_two_simultaneous_answers_exactly_one_wins(broker, call):
    task = asyncio.create_task(broker.permissions.ask(consent_request()))
    await until_pending(broker.permissions)
    replies = await asyncio.gather(
        call(KERNEL_A, "permission.answer", {"request_id": "pr_1", "decision": "allow"}),
        call(KERNEL_A, "permission.answer", {"request_id": "pr_1", "decision": "deny"}),
    )
    wins = [r for r in replies if "result" in r]
    losses = [r for r in replies if "error" in r]
    assert len(wins) == 1 and len(losses) == 1
    assert losses[0]["error"]["data"]["code"] == "CONFLICT"
    assert (await task).decision.value == wins[0]["result"]["decision"]


@pytest.mark.asyncio
async def test_answer_after_end_is_an_error(broker, call):
    task = asyncio.create_task(broker.permissions.ask(consent_request()))
    await until_pending(broker.permissions)
    broker.permissions.answer(KERNEL_A, "pr_1", ConsentDecision.DENY, ConsentScope.ONCE)
    await task
    late = await call(KERNEL_A, "permission.answer", {"request_id": "pr_1", "decision": "allow"})
    assert late["error"]["code"] == -32000 and late["error"]["data"]["code"] == "CONFLICT"
    unknown = await call(KERNEL_A, "permission.answer", {"request_id": "pr_nope", "decision": "allow"})
    assert unknown["error"]["data"]["code"] == "NOT_FOUND"


@pytest.mark.asyncio
async def test_timeout_denies_and_emits_event(broker, call):
    broker.permissions.timeout = 0.05
    result = await broker.permissions.ask(consent_request(deadline_in=30))
    assert result.decision is ConsentDecision.TIMEOUT
    events = broker.store.events_since(0)
    assert [e.type for e in events] == [EventType.PERMISSION_REQUEST, EventType.PERMISSION_TIMEOUT,
                                        EventType.PERMISSION_RESOLVED]
    assert events[-1].data["decision"] == "timeout" and events[-1].data["request_id"] == "pr_1"
    late = await call(KERNEL_A, "permission.answer", {"request_id": "pr_1", "decision": "allow"})
    assert late["error"]["data"]["code"] == "CONFLICT"


@pytest.mark.asyncio
async def test_scope_run_remembered_for_that_run_only(broker):
    router = broker.permissions
    task = asyncio.create_task(router.ask(consent_request("pr_1", run_id="r1")))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_1", ConsentDecision.ALLOW, ConsentScope.RUN)
    await task
    again = await router.ask(consent_request("pr_2", run_id="r1"))
    assert again.decision is ConsentDecision.ALLOW and again.answered_by == "scope:run"
    other_run = asyncio.create_task(router.ask(consent_request("pr_3", run_id="r2")))
    await until_pending(router)
    assert not other_run.done()
    router.answer(KERNEL_A, "pr_3", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await other_run).decision is ConsentDecision.DENY
    broker.events.append(EventType.DONE, {}, origin=KERNEL_A.origin, run_id="r1")
    forgotten = asyncio.create_task(router.ask(consent_request("pr_4", run_id="r1")))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_4", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await forgotten).decision is ConsentDecision.DENY


@pytest.mark.asyncio
async def test_scope_notebook_is_bound_to_the_digest(broker, call):
    router = broker.permissions
    task = asyncio.create_task(router.ask(consent_request("pr_1")))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_1", ConsentDecision.ALLOW, ConsentScope.NOTEBOOK)
    await task
    trusted = await router.ask(consent_request("pr_2", run_id="other"))
    assert trusted.answered_by == "trust:notebook"
    changed = ToolSpec(name="write_file", tool_class=ToolClass.WRITE, description="now different")
    task = asyncio.create_task(router.ask(consent_request("pr_3", tool=changed)))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_3", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await task).decision is ConsentDecision.DENY
    listed = await call(KERNEL_A, "trust.list", {})
    assert [t["tool"] for t in listed["result"]["trust"]] == ["write_file"]
    assert (await call(KERNEL_B, "trust.list", {}))["result"]["trust"] == []
    assert (await call(KERNEL_A, "trust.revoke", {"tool": "write_file"}))["result"]["revoked"] is True


@pytest.mark.asyncio
async def test_pending_lists_only_answerable(broker, call):
    task = asyncio.create_task(broker.permissions.ask(consent_request()))
    await until_pending(broker.permissions)
    mine = await call(KERNEL_A, "permission.pending", {})
    assert [r["request_id"] for r in mine["result"]["requests"]] == ["pr_1"]
    assert (await call(KERNEL_B, "permission.pending", {}))["result"]["requests"] == []
    killed = await call(KERNEL_A, "kill", {})
    assert killed["result"]["denied_requests"] == 1
    assert (await task).decision is ConsentDecision.DENY


@pytest.mark.asyncio
async def test_cancelled_wait_ends_the_request(broker):
    task = asyncio.create_task(broker.permissions.ask(consent_request()))
    await until_pending(broker.permissions)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(RoutingRefusal) as exc:
        broker.permissions.answer(KERNEL_A, "pr_1", ConsentDecision.ALLOW, ConsentScope.ONCE)
    assert exc.value.code is Code.CONFLICT


# -- issue 11 item 9: a timed-out consent, through the real gate and router --------------------------

@pytest.mark.asyncio
async def test_gate_timeout_is_the_routers_timeout_not_a_cancel():
    """The gate used to cancel the router at its own timer (permission.resolved "cancelled", no
    permission_timeout); the router's deadline must decide: one permission_timeout, exactly one
    permission.resolved "timeout", and the gate's PERMISSION_TIMEOUT refusal."""
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.core.errors import GateRefusal
    from relay_jupyter.core.types import Grant

    broker = Broker.open(BrokerConfig(in_memory=True, consent_timeout=0.3))
    try:
        broker.grants.issue(Grant(origin=KERNEL_A.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  consent_id="c"))
        ran = []

        async def execute():
            ran.append(1)

        req = ToolRequest(origin=KERNEL_A.origin, tool=WRITE, arguments={"path": "x"}, call_id="c1", run_id="r1",
                          originator=KERNEL_A.client_id)
        with pytest.raises(GateRefusal) as info:
            await broker.gate.call_tool(req, execute, broker.permissions)
        assert info.value.code is Code.PERMISSION_TIMEOUT and ran == []
        events = broker.store.events_since(0)
        assert [e.type for e in events] == [EventType.PERMISSION_REQUEST, EventType.PERMISSION_TIMEOUT,
                                            EventType.PERMISSION_RESOLVED]
        assert [e.data["decision"] for e in events if e.type == EventType.PERMISSION_RESOLVED] == ["timeout"]
        rid = events[0].data["request_id"]
        assert {e.data["request_id"] for e in events} == {rid}
        with pytest.raises(RoutingRefusal) as late:
            broker.permissions.answer(KERNEL_A, rid, ConsentDecision.ALLOW, ConsentScope.ONCE)
        assert late.value.code is Code.CONFLICT
        denied = [r for r in broker.audit.tail(10) if r.decision == "deny"]
        assert [r.code for r in denied] == ["PERMISSION_TIMEOUT"]
    finally:
        broker.close()


# -- issue 11 item 6: run_code is approved one call at a time ----------------------------------------

RUN_CODE = ToolSpec(name="run_code", tool_class=ToolClass.WRITE, runs_code=True)


@pytest.mark.asyncio
async def test_scopes_offered_on_the_card(broker):
    router = broker.permissions
    for rid, tool, scopes in (("pr_w", WRITE, ["once", "run", "notebook"]), ("pr_c", RUN_CODE, ["once"])):
        task = asyncio.create_task(router.ask(consent_request(rid, tool=tool)))
        await until_pending(router)
        assert router._pending[rid].payload["scopes"] == scopes
        assert broker.store.events_since(0)[-1].data["scopes"] == scopes
        router.answer(KERNEL_A, rid, ConsentDecision.DENY, ConsentScope.ONCE)
        await task


@pytest.mark.asyncio
async def test_run_code_refuses_run_and_notebook_scopes_and_stays_pending(broker, call):
    router = broker.permissions
    task = asyncio.create_task(router.ask(consent_request("pr_1", tool=RUN_CODE)))
    await until_pending(router)
    for caller, scope in ((KERNEL_A, "run"), (KERNEL_A, "notebook"), (BROWSER, "run")):
        reply = await call(caller, "permission.answer", {"request_id": "pr_1", "decision": "allow", "scope": scope})
        assert reply["error"]["data"]["code"] == "WIDENING_REFUSED", reply
    assert not task.done() and "pr_1" in router._pending
    assert [e.type for e in broker.store.events_since(0)] == [EventType.PERMISSION_REQUEST]
    ok = await call(KERNEL_A, "permission.answer", {"request_id": "pr_1", "decision": "allow", "scope": "once"})
    assert ok["result"]["decision"] == "allow" and ok["result"]["scope"] == "once"
    assert (await task).decision is ConsentDecision.ALLOW
    assert router._run_allows == {} and broker.store.list_trust() == []
    # the next run_code call of the same run asks again
    again = asyncio.create_task(router.ask(consent_request("pr_2", tool=RUN_CODE)))
    await until_pending(router)
    assert not again.done()
    router.answer(KERNEL_A, "pr_2", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await again).decision is ConsentDecision.DENY


@pytest.mark.asyncio
async def test_saved_trust_and_run_allows_never_apply_to_run_code(broker):
    from relay_jupyter.runtime.tools import tool_identity

    router = broker.permissions
    # trust and a run allow exactly as a "notebook"/"run" answer would have stored them
    broker.store.add_trust(KERNEL_A.origin, *RUN_CODE.key, tool_identity(RUN_CODE))
    router._run_allows["run1"] = {("run_code", tool_identity(RUN_CODE))}
    task = asyncio.create_task(router.ask(consent_request("pr_1", tool=RUN_CODE)))
    await until_pending(router)
    assert not task.done()
    router.answer(KERNEL_A, "pr_1", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await task).decision is ConsentDecision.DENY


@pytest.mark.asyncio
async def test_run_allow_is_bound_to_the_tool_identity(broker):
    """A run allow given for a tool does not reach the same name with other annotations."""
    router = broker.permissions
    task = asyncio.create_task(router.ask(consent_request("pr_1")))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_1", ConsentDecision.ALLOW, ConsentScope.RUN)
    await task
    destructive = WRITE.model_copy(update={"hints": {"destructive_hint": True}})
    other = asyncio.create_task(router.ask(consent_request("pr_2", tool=destructive)))
    await until_pending(router)
    assert not other.done()
    router.answer(KERNEL_A, "pr_2", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await other).decision is ConsentDecision.DENY


# -- issue 11 item 4: a changed tool's card ----------------------------------------------------------

@pytest.mark.asyncio
async def test_changed_tool_skips_trust_and_shows_the_change(broker):
    from relay_jupyter.runtime.tools import tool_change, tool_identity

    router = broker.permissions
    broker.store.add_trust(KERNEL_A.origin, *WRITE.key, tool_identity(WRITE))
    assert (await router.ask(consent_request("pr_0"))).answered_by == "trust:notebook"
    change = tool_change(WRITE.model_copy(update={"description": "old"}), WRITE)
    req = ToolRequest(origin=KERNEL_A.origin, tool=WRITE, call_id="c1", run_id="run1", originator=KERNEL_A.client_id,
                      preview={"tool_changed": change, "tool_digest": "d"})
    task = asyncio.create_task(router.ask(ConsentRequest(request_id="pr_1", request=req, deadline=time.time() + 30)))
    await until_pending(router)
    payload = broker.store.events_since(0)[-1].data
    assert payload["tool_changed"]["diff"].startswith("--- offered\n+++ now\n")
    assert '-  "description": "old"' in payload["tool_changed"]["diff"]
    assert payload["preview"] == {"tool_digest": "d"}
    router.answer(KERNEL_A, "pr_1", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await task).decision is ConsentDecision.DENY


# -- issue 12: kernel lifetime ------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_withdraw_ends_the_kernels_requests_for_every_caller(broker, call):
    router = broker.permissions
    mine = asyncio.create_task(router.ask(consent_request("pr_1")))
    other_req = ToolRequest(origin=KERNEL_B.origin, tool=WRITE, call_id="c2", run_id="rb",
                            originator=KERNEL_B.client_id)
    other = asyncio.create_task(router.ask(ConsentRequest(request_id="pr_b", request=other_req,
                                                          deadline=time.time() + 30)))
    await until_pending(router, 2)
    assert router.withdraw(originator=KERNEL_A.client_id, reason="restarted") == ["pr_1"]
    result = await mine
    assert result.decision is ConsentDecision.DENY and result.answered_by == "withdrawn:restarted"
    for caller in (BROWSER, KERNEL_A):
        reply = await call(caller, "permission.answer", {"request_id": "pr_1", "decision": "allow",
                                                         "scope": "notebook"})
        assert reply["error"]["data"]["code"] == "CONFLICT"
    assert broker.store.list_trust() == []
    resolved = [e.data for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_RESOLVED]
    assert [(r["request_id"], r["decision"]) for r in resolved] == [("pr_1", "withdrawn")]
    assert not other.done() and router.withdraw(originator=KERNEL_A.client_id, reason="restarted") == []
    router.answer(KERNEL_B, "pr_b", ConsentDecision.DENY, ConsentScope.ONCE)
    await other
