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

WRITE = ToolSpec(name="run_code", tool_class=ToolClass.WRITE)


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
    types = [e.type for e in broker.store.events_since(0)]
    assert types[-1] == EventType.PERMISSION_TIMEOUT
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
    changed = ToolSpec(name="run_code", tool_class=ToolClass.WRITE, description="now different")
    task = asyncio.create_task(router.ask(consent_request("pr_3", tool=changed)))
    await until_pending(router)
    router.answer(KERNEL_A, "pr_3", ConsentDecision.DENY, ConsentScope.ONCE)
    assert (await task).decision is ConsentDecision.DENY
    listed = await call(KERNEL_A, "trust.list", {})
    assert [t["tool"] for t in listed["result"]["trust"]] == ["run_code"]
    assert (await call(KERNEL_B, "trust.list", {}))["result"]["trust"] == []
    assert (await call(KERNEL_A, "trust.revoke", {"tool": "run_code"}))["result"]["revoked"] is True


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
