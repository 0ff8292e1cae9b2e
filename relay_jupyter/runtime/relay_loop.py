"""The built-in ``relay`` engine (runtime/engine.py's seam): the agent loop over a model backend.

Context pipeline -> turn driver -> scheduler -> executor, repeated until the model stops, the step limit is
hit, the budget runs out or the run is cancelled. Everything that makes a run safe comes from the
:class:`~relay_jupyter.runtime.engine.EngineRun` the run manager lends: the gate (capability set, model
requests), the executor (every tool call), the step cap (``run.step``), the events and the conversation.
The loop keeps its in-flight state on ``run.state`` (the manager's record: the turn being streamed, the
calls pending) so that the manager, which decides the run's one terminal event, can answer every call of
an interrupted turn in the history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend, ToolCallDone
from ..core.budgets import REQUEST_OVERHEAD, TOOLS_PROMPT_OVERHEAD, RequestEstimate, estimate_request
from ..core.errors import Code, ConfigRefusal
from ..protocol.names import EventType
from .call_ids import CallIds, history_ids
from .context import prepare, tool_result_block
from .driver import (Coalescer, LoopShare, TurnResult, charge_outcome, drive_turn, streamed_output_tokens,
                     usage_event)
from .offload import off_loop, off_loop_or_undo
from .tools import ToolIndex, ToolResult, ToolSource

if TYPE_CHECKING:
    from ..core.types import ToolSpec
    from .engine import EngineRun
    from .manager import RunManager, RunParams

__all__ = ["RelayLoopEngine", "ToolEstimates", "answer_pending", "append_assistant", "relay_loop"]


class RelayLoopEngine:
    """The built-in engine: the loop of this module over a model backend (``anthropic``, ``openai``,
    ``demo``) of the run manager."""

    name = "relay"

    def __init__(self, manager: RunManager) -> None:
        self._manager = manager

    def check(self, params: RunParams) -> None:
        backends = self._manager.backends
        backend = self._manager.backend_for(params)
        if backend is None:
            raise ConfigRefusal(Code.NO_BACKEND, f"no backend named {params.backend!r} is configured "
                                f"(available: {', '.join(sorted(backends)) or 'none'})")
        if not backend.allows_model(params.model):
            raise ConfigRefusal(Code.MODEL_NOT_ALLOWED,
                                f"model {params.model!r} is not allowed for backend {params.backend!r}")

    async def drive(self, run: EngineRun) -> None:
        backend = self._manager.backend_for(run.params)
        assert backend is not None  # check() ran at start
        await relay_loop(run, backend, self._manager.providers)


async def relay_loop(run: EngineRun, backend: Backend, providers: Sequence[ToolSource]) -> None:
    """Drive ``run`` to the end (how it ends decides the terminal event: runtime/engine.py)."""
    cfg, params, ctx, state = run.config, run.params, run.ctx, run.state
    share = LoopShare(asyncio.get_running_loop())  # a long history's work is done in slices (issue 18)
    # loaded once, the prompt appended and stored; every store and gate call of the loop runs on a store
    # thread (runtime/offload.py): a locked budget row or database stalls this run, not the broker
    history = await run.begin_async() if run.begin_async is not None else run.begin()
    await share.checkpoint()
    call_ids = CallIds(history_ids(history))
    budget = await off_loop(run.gate.run_budget, ctx.origin)
    # the run's tools (its ``tools`` restriction applied); calls to these reach the gate, which
    # refuses and audits anything outside the grant (SCOPE_EXCEEDED)
    index = ToolIndex(providers, run.tool_ctx, allowed=params.tools)
    max_tokens = params.max_tokens or cfg.max_tokens
    estimates = ToolEstimates()
    while True:
        run.step()  # the step cap (BUDGET_EXCEEDED past it) and run.step; the gate counts it on the RunBudget
        messages = prepare(history, result_budget=cfg.result_budget)
        # the capability set: only what the grant allows now (re-read each step, so a grant
        # narrowed or revoked mid-run shrinks the offer at the next request)
        specs = await offered_off_loop(run.gate, ctx.origin, index)
        # the whole request: system prompt, offered tools, history, and max_tokens (docs/gate.md §6)
        estimate = await estimates.request(cfg.system_prompt, messages, specs, max_tokens, share)
        await share.checkpoint()  # the backend's SDK then builds the whole request (all the history) at once
        # a cancel while the hold is taken releases it (the request was never sent)
        reservation = await off_loop_or_undo(
            lambda r: r.release(), run.gate.begin_completion, ctx.origin, params.model, estimate=estimate,
            run=budget, purpose=f"agent:{params.profile}" if params.profile else None)
        turn = state.current = TurnResult()
        coalescer = Coalescer(run.text, interval=cfg.coalesce_interval, max_chars=cfg.coalesce_chars)
        ended: BaseException | None = None
        try:
            await drive_turn(backend, model=params.model, system=cfg.system_prompt, messages=messages,
                             tools=specs, max_tokens=max_tokens, coalescer=coalescer, result=turn,
                             call_ids=call_ids, turn_timeout=cfg.turn_timeout,
                             idle_timeout=cfg.turn_idle_timeout, share=share)
        except BaseException as exc:
            ended = exc
            raise
        finally:
            # charged what judge_usage decides: reported, clamped, estimated, or the reservation
            await off_loop(run.gate.settle_completion, reservation, params.model,
                           turn.usage if turn.usage_reported else None, budget, outcome=charge_outcome(turn, ended),
                           streamed_output_tokens=streamed_output_tokens(turn, max_tokens))
            run.emit(EventType.USAGE, usage_event(turn, reservation))
            run.settled(reservation, turn, ended)
        state.current = None
        append_assistant(state, turn)
        if not turn.calls:
            await _save(run)
            return
        state.pending, state.results = list(turn.calls), {}
        await _save(run)  # the tool_use is durable before any intent: crash repair can answer it
        await schedule(run, index)
        answer_pending(state)
        await _save(run)


async def _save(run: EngineRun) -> None:
    if run.save_async is not None:
        await run.save_async()
    else:
        run.save()


async def offered_off_loop(gate: Any, origin: str, index: ToolIndex) -> list[Any]:
    """:func:`offered` with the grant read on a store thread."""
    specs = index.specs()
    allowed = set(await off_loop(gate.allowed_tools, origin, [s.name for s in specs]))
    return [s for s in specs if s.name in allowed]


def offered(gate: Any, origin: str, index: ToolIndex) -> list[Any]:
    """The specs of ``index`` that the live grant of ``origin`` allows (none without a grant)."""
    specs = index.specs()
    allowed = set(gate.allowed_tools(origin, [s.name for s in specs]))
    return [s for s in specs if s.name in allowed]


async def schedule(run: EngineRun, index: ToolIndex) -> None:
    """A turn's calls run concurrently only when every one is parallel-safe; each through the executor."""
    state = run.state
    calls = state.pending
    found = [index.get(c.name) for c in calls]
    parallel = len(calls) > 1 and all(f is not None and f[1].parallel_safe for f in found)

    async def one(call: ToolCallDone) -> None:
        state.results[call.id] = await run.executor.run_call(run.tool_ctx, index, call)

    if parallel:
        await asyncio.gather(*(one(c) for c in calls))
    else:
        for call in calls:
            await one(call)


def append_assistant(state: Any, turn: TurnResult) -> None:
    """Append the turn's assistant message (its text and tool calls) to the run's history."""
    msg = turn.message()
    if msg["content"]:
        msg["turn"] = state.turn
        state.history.append(msg)


def answer_pending(state: Any) -> None:
    """Append the tool_result message answering every pending call, in the model's order; a call without
    a result was stopped ("cancelled: ... the action may have happened")."""
    if not state.pending:
        return
    blocks = []
    for call in state.pending:
        result = state.results.get(call.id)
        if result is None:
            result = ToolResult("cancelled: the run was stopped before this call finished; "
                                "if it had started, the action may have happened",
                                is_error=True, code=Code.CANCELLED.value)
        blocks.append(tool_result_block(call.id, call.name, result.content, result.is_error))
    state.history.append({"role": "user", "content": blocks, "turn": state.turn})
    state.pending, state.results = [], {}


class ToolEstimates:
    """The request estimate with each offered tool's share computed once per run (issue 18: with 1k tools,
    157 KB of schemas were serialised for the estimate at every step). A tool's share is cached by the
    identity of its ``ToolSpec`` (frozen), so a tool a source re-describes is counted again; the total
    equals :func:`~relay_jupyter.core.budgets.estimate_request` exactly."""

    def __init__(self) -> None:
        self._tokens: dict[int, tuple[ToolSpec, int]] = {}

    def tool(self, spec: ToolSpec) -> int:
        hit = self._tokens.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        n = estimate_request("", (), [spec], 0).input_tokens - REQUEST_OVERHEAD - TOOLS_PROMPT_OVERHEAD
        self._tokens[id(spec)] = (spec, n)  # the spec is kept: its id cannot be reused while cached
        return n

    async def request(self, system: str, messages: Sequence[dict[str, Any]], specs: Sequence[ToolSpec],
                      max_tokens: int, share: LoopShare | None = None) -> RequestEstimate:
        """The estimate, message by message: a long history's JSON is tens of ms of work (issue 18: the
        event loop held that long at every step of a 200-turn conversation), so with ``share`` the
        loop gets its turn between messages whenever the slice is used up."""
        n = estimate_request(system, (), (), max_tokens).input_tokens
        for m in messages:
            n += estimate_request("", (m,), (), 0).input_tokens - REQUEST_OVERHEAD
            if share is not None:
                await share.checkpoint()
        if specs:
            n += sum(self.tool(s) for s in specs) + TOOLS_PROMPT_OVERHEAD
        return RequestEstimate(input_tokens=n, max_output=max_tokens)
