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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    def prepare(self, run: EngineRun) -> Callable[[], FirstRequest]:
        """The first model request's store work, done in ``run.start``'s one store call (runtime/engine.py):
        the prompt appended and stored, the run's caps, the capability set and the reservation (the journal
        row exists already: the model cannot spend before it). The loop then sends the request at once."""
        params, cfg = run.params, run.config
        index = ToolIndex(self._manager.providers, run.tool_ctx, allowed=params.tools)  # on the loop
        candidates, estimates = index.specs(), ToolEstimates()
        max_tokens = params.max_tokens or cfg.max_tokens

        def work() -> FirstRequest:
            history = run.begin()  # the prompt is durable before the model is asked (crash repair keeps it)
            budget = run.gate.run_budget(run.ctx.origin)
            messages = prepare(history, result_budget=cfg.result_budget)
            counted = estimates.count(cfg.system_prompt, messages, max_tokens)
            specs, reservation = _reserve(run, candidates, estimates, counted, budget)
            return FirstRequest(history, budget, index, estimates, messages, specs, reservation)

        return work


@dataclass
class FirstRequest:
    """The first model request of a run, ready to send (:meth:`RelayLoopEngine.prepare`)."""

    history: list[dict[str, Any]]
    budget: Any
    index: ToolIndex
    estimates: ToolEstimates
    messages: list[dict[str, Any]]
    specs: list[Any]
    reservation: Any

    def undo(self) -> None:
        """Never sent (the run was cancelled first): the hold is released."""
        self.reservation.release()


def _reserve(run: EngineRun, candidates: Sequence[Any], estimates: ToolEstimates, counted: RequestEstimate,
             budget: Any) -> tuple[list[Any], Any]:
    """On a store thread: the capability set (only what the grant allows now: re-read at each request, so a
    grant narrowed or revoked mid-run shrinks the offer at the next one) and the request's reservation."""
    params = run.params
    allowed = set(run.gate.allowed_tools(run.ctx.origin, [s.name for s in candidates]))
    specs = [s for s in candidates if s.name in allowed]
    reservation = run.gate.begin_completion(run.ctx.origin, params.model, estimate=estimates.with_tools(counted, specs),
                                            run=budget, purpose=f"agent:{params.profile}" if params.profile else None)
    return specs, reservation


async def relay_loop(run: EngineRun, backend: Backend, providers: Sequence[ToolSource]) -> None:
    """Drive ``run`` to the end (how it ends decides the terminal event: runtime/engine.py)."""
    cfg, params, ctx, state = run.config, run.params, run.ctx, run.state
    share = LoopShare(asyncio.get_running_loop())  # a long history's work is done in slices (issue 18)
    # every store and gate call of the loop runs on a store thread (runtime/offload.py): a locked budget row or
    # database stalls this run, not the broker. The first request was made ready in run.start's one store call
    # (RelayLoopEngine.prepare: the history loaded once, the prompt appended and stored, the grant, the hold);
    # each later one takes one store call of its own (the grant and the hold)
    first: FirstRequest | None = await run.first() if run.first is not None else None
    max_tokens = params.max_tokens or cfg.max_tokens
    if first is not None:
        history, budget, index, estimates = first.history, first.budget, first.index, first.estimates
    else:  # an EngineRun without the manager's start (its begin, then the caps, each off the loop)
        history = await run.begin_async() if run.begin_async is not None else run.begin()
        await share.checkpoint()
        budget = await off_loop(run.gate.run_budget, ctx.origin)
        # the run's tools (its ``tools`` restriction applied); calls to these reach the gate, which
        # refuses and audits anything outside the grant (SCOPE_EXCEEDED)
        index, estimates = ToolIndex(providers, run.tool_ctx, allowed=params.tools), ToolEstimates()
    call_ids = CallIds(history_ids(history))
    while True:
        if first is not None:
            try:
                run.step()  # the step cap (BUDGET_EXCEEDED past it) and run.step
            except BaseException:
                await off_loop(first.undo)  # never sent: the hold is released
                raise
            messages, specs, reservation, first = first.messages, first.specs, first.reservation, None
        else:
            run.step()  # the step cap (BUDGET_EXCEEDED past it) and run.step; the gate counts it on the RunBudget
            messages = prepare(history, result_budget=cfg.result_budget)
            # the whole request (docs/gate.md §6): the history's share here, sliced so the loop is shared (a
            # long history is tens of ms of JSON); the offered tools' share once the grant is read, in the
            # request's one store call with the reservation (a cancel meanwhile releases the hold: never sent)
            counted = await estimates.messages(cfg.system_prompt, messages, max_tokens, share)
            specs, reservation = await off_loop_or_undo(lambda r: r[1].release(), _reserve, run, index.specs(),
                                                        estimates, counted, budget)
        await share.checkpoint()  # the backend's SDK then builds the whole request (all the history) at once
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
        return self.with_tools(await self.messages(system, messages, max_tokens, share), specs)

    async def messages(self, system: str, messages: Sequence[dict[str, Any]], max_tokens: int,
                       share: LoopShare | None = None) -> RequestEstimate:
        """The estimate without tools (:meth:`request`'s first part: the one that grows with the history)."""
        n = estimate_request(system, (), (), max_tokens).input_tokens
        for m in messages:
            n += estimate_request("", (m,), (), 0).input_tokens - REQUEST_OVERHEAD
            if share is not None:
                await share.checkpoint()
        return RequestEstimate(input_tokens=n, max_output=max_tokens)

    def count(self, system: str, messages: Sequence[dict[str, Any]], max_tokens: int) -> RequestEstimate:
        """:meth:`messages` on a store thread: message by message too, not the whole history in one call. One
        JSON encoding of a long history is tens of ms in C holding the GIL, so the event loop waited for it
        (Run I of benchmarks/README.md: loop lag p99 100-200 ms over a 200-turn conversation); per message,
        the interpreter hands the GIL back to the loop between messages."""
        n = estimate_request(system, (), (), max_tokens).input_tokens
        for m in messages:
            n += estimate_request("", (m,), (), 0).input_tokens - REQUEST_OVERHEAD
        return RequestEstimate(input_tokens=n, max_output=max_tokens)

    def with_tools(self, counted: RequestEstimate, specs: Sequence[ToolSpec]) -> RequestEstimate:
        """``counted`` (from :meth:`messages`) with the offered tools' share added (each computed once)."""
        if not specs:
            return counted
        n = counted.input_tokens + sum(self.tool(s) for s in specs) + TOOLS_PROMPT_OVERHEAD
        return RequestEstimate(input_tokens=n, max_output=counted.max_output)
