"""The executor re-reads each tool from its source before the call (issue 11 item 4): a changed tool
is a write with a ``tool_changed`` card and the run's index offers the new spec; a tool its source no
longer offers is refused; a source that cannot say refuses the call. (The real MCP server version of
these is tests/mcp/test_mcp_tool_identity.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from relay_jupyter.backends.base import ToolCallDone
from relay_jupyter.core.memory import MemoryRunJournal
from relay_jupyter.core.types import ConsentDecision, PermissionMode, ToolClass, ToolSpec
from relay_jupyter.runtime.executor import CHANGED_REASON, Executor
from relay_jupyter.runtime.tools import LocalTools, ToolContext, ToolIndex, tool_identity

from .rig import CLIENT, ORIGIN, DelayedConsent, make_gate

pytestmark = pytest.mark.asyncio

READ = ToolSpec(name="peek", description="Peek.", tool_class=ToolClass.READ, parallel_safe=True,
                input_schema={"type": "object", "properties": {"k": {"type": "string"}}},
                hints={"read_only_hint": True})


class Changing(LocalTools):
    """A source whose tool the test swaps between offering it and the call."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[dict[str, Any]] = []
        self.add(READ, lambda args: self.ran.append(args) or "peeked")
        self.now: ToolSpec | None | Exception = READ

    async def current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        if isinstance(self.now, Exception):
            raise self.now
        return self.now


def _setup(decision: ConsentDecision = ConsentDecision.DENY):
    gate, _, audit = make_gate()
    consent = DelayedConsent(decision, delay=0)
    source = Changing()
    ctx = ToolContext(origin=ORIGIN, conversation="c", originator=CLIENT, run_id=None, mode=PermissionMode.ASK)
    index = ToolIndex([source], ctx)
    executor = Executor(gate, MemoryRunJournal(), lambda *a: None, lambda _ctx: consent)
    return executor, index, ctx, source, consent, audit


def _call(args: dict[str, Any] | None = None) -> ToolCallDone:
    return ToolCallDone(id="t1", name="peek", input=args or {}, raw=None, raw_size=2)


async def test_unchanged_read_runs_without_asking() -> None:
    executor, index, ctx, source, consent, _ = _setup()
    result = await executor.run_call(ctx, index, _call())
    assert not result.is_error and consent.asked == [] and source.ran == [{}]


async def test_annotations_alone_make_a_changed_tool_that_asks() -> None:
    executor, index, ctx, source, consent, audit = _setup()
    source.now = READ.model_copy(update={"hints": {"read_only_hint": False, "destructive_hint": True}})
    assert tool_identity(source.now) != tool_identity(READ) and source.now.digest == READ.digest
    result = await executor.run_call(ctx, index, _call())
    assert result.code == "CONSENT_DENIED" and source.ran == []
    asked = consent.asked[0].request
    assert asked.tool.tool_class is ToolClass.WRITE and asked.reasons[0] == CHANGED_REASON
    change = asked.preview["tool_changed"]
    assert change["old"]["annotations"] == {"read_only_hint": True}
    assert '+    "destructive_hint": true' in change["diff"]
    assert index.get("peek")[1] == source.now  # offered from the next step on
    assert audit.tail(1)[0].tool_class is ToolClass.WRITE


async def test_a_changed_schema_is_what_the_arguments_are_checked_against() -> None:
    executor, index, ctx, source, consent, _ = _setup(ConsentDecision.ALLOW)
    source.now = READ.model_copy(update={"input_schema": {"type": "object", "required": ["target"]}})
    refused = await executor.run_call(ctx, index, _call({"k": "v"}))
    assert refused.code == "INVALID_ARGUMENTS" and consent.asked == [] and source.ran == []
    assert index.get("peek")[1] == source.now  # the model is offered the new schema
    # the refused call never reached a card, so the next one is still the changed tool: it asks
    ran = await executor.run_call(ctx, index, _call({"target": "x"}))
    assert not ran.is_error and source.ran == [{"target": "x"}] and len(consent.asked) == 1
    assert "tool_changed" in consent.asked[0].request.preview
    # approved once: later calls are compared with the version the person saw, and ask nothing more
    again = await executor.run_call(ctx, index, _call({"target": "y"}))
    assert not again.is_error and len(consent.asked) == 1


async def test_a_tool_the_source_no_longer_offers_is_refused_and_leaves_the_run() -> None:
    executor, index, ctx, source, consent, _ = _setup()
    source.now = None
    result = await executor.run_call(ctx, index, _call())
    assert result.code == "UNKNOWN_TOOL" and source.ran == [] and index.get("peek") is None


async def test_a_source_that_cannot_say_refuses_the_call() -> None:
    executor, index, ctx, source, consent, _ = _setup()
    source.now = RuntimeError("server gone")
    result = await executor.run_call(ctx, index, _call())
    assert result.code == "TOOL_ERROR" and "could not re-read" in result.content and source.ran == []


async def test_changed_and_changed_back_before_a_card_runs_as_offered() -> None:
    executor, index, ctx, source, consent, _ = _setup()
    source.now = READ.model_copy(update={"input_schema": {"type": "object", "required": ["target"]}})
    assert (await executor.run_call(ctx, index, _call({"k": "v"}))).code == "INVALID_ARGUMENTS"
    source.now = READ  # the server put the approved tool back
    result = await executor.run_call(ctx, index, _call({"k": "v"}))
    assert not result.is_error and consent.asked == [] and source.ran == [{"k": "v"}]
    assert index.get("peek")[1] == READ


async def test_a_pin_removed_mid_run_makes_the_next_call_ask() -> None:
    executor, index, ctx, source, consent, _ = _setup()
    source.now = READ.model_copy(update={"tool_class": ToolClass.WRITE})  # same identity, now a write
    result = await executor.run_call(ctx, index, _call())
    assert result.code == "CONSENT_DENIED" and "tool_changed" not in consent.asked[0].request.preview
