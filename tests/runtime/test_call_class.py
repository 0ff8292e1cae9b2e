"""A provider's preflight can make one call stricter than its spec (``Preflight.tool_class``), never
looser: a read that reaches outside the read roots, or a tool that changed since it was offered, is
asked about as a write."""

from __future__ import annotations

from typing import Any

import pytest

from relay_jupyter.backends.base import ToolCallDone
from relay_jupyter.core.memory import MemoryRunJournal
from relay_jupyter.core.types import ConsentDecision, PermissionMode, ToolClass, ToolSpec
from relay_jupyter.runtime.executor import Executor
from relay_jupyter.runtime.tools import LocalTools, Preflight, ToolContext, ToolIndex

from .rig import CLIENT, ORIGIN, DelayedConsent, make_gate

pytestmark = pytest.mark.asyncio


def _tools(pre_class: ToolClass | None, spec_class: ToolClass) -> tuple[LocalTools, list[dict[str, Any]]]:
    ran: list[dict[str, Any]] = []
    tools = LocalTools()
    tools.add(ToolSpec(name="peek", tool_class=spec_class, input_schema={"type": "object"}),
              lambda args: ran.append(args) or "peeked",
              preflight=lambda args: Preflight(reasons=("outside the read roots",), tool_class=pre_class))
    return tools, ran


async def _call(pre_class: ToolClass | None, spec_class: ToolClass, decision: ConsentDecision):
    gate, _, audit = make_gate()
    consent = DelayedConsent(decision, delay=0)
    tools, ran = _tools(pre_class, spec_class)
    ctx = ToolContext(origin=ORIGIN, conversation="c", originator=CLIENT, run_id=None, mode=PermissionMode.ASK)
    executor = Executor(gate, MemoryRunJournal(), lambda *a: None, lambda _ctx: consent)
    result = await executor.run_call(ctx, ToolIndex([tools], ctx),
                                     ToolCallDone(id="t1", name="peek", input={}, raw=None, raw_size=2))
    return result, consent, ran, audit


async def test_preflight_escalates_a_read_to_a_write_that_asks() -> None:
    result, consent, ran, audit = await _call(ToolClass.WRITE, ToolClass.READ, ConsentDecision.DENY)
    assert [r.request.tool.tool_class for r in consent.asked] == [ToolClass.WRITE]
    assert consent.asked[0].request.reasons == ("outside the read roots",)
    assert result.is_error and result.code == "CONSENT_DENIED" and ran == []
    assert audit.tail(1)[0].tool_class is ToolClass.WRITE


async def test_escalated_call_runs_after_approval() -> None:
    result, consent, ran, _ = await _call(ToolClass.WRITE, ToolClass.READ, ConsentDecision.ALLOW)
    assert len(consent.asked) == 1 and not result.is_error and ran == [{}]


async def test_preflight_cannot_make_a_write_a_read() -> None:
    result, consent, ran, _ = await _call(ToolClass.READ, ToolClass.WRITE, ConsentDecision.DENY)
    assert len(consent.asked) == 1 and result.code == "CONSENT_DENIED" and ran == []


async def test_no_class_keeps_the_spec_class() -> None:
    result, consent, ran, _ = await _call(None, ToolClass.READ, ConsentDecision.DENY)
    assert consent.asked == [] and not result.is_error and ran == [{}]
