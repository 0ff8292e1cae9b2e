"""The run-engine seam: what drives a run's turns, while the broker keeps what makes it safe.

A :class:`RunEngine` owns *the loop* of a run — asking a model, proposing tool calls, deciding when the
run is done. The broker keeps everything else and hands it to the engine in an :class:`EngineRun`:

- the **gate** and the **executor** (every tool call: grant, schema, preflight, gate, consent, journal
  intent and outcome, audit — ``runtime/executor.py``), with the run's :class:`ToolContext`;
- the **events** of the run (``emit``; ``text`` for streamed assistant text, coalesced by the caller);
- the **conversation** (``begin()`` loads it and adds the prompt, ``add()`` appends a message);
- the run's budget and step cap (``config.max_steps``); model requests are charged by the gate.

The :class:`~relay_jupyter.runtime.manager.RunManager` decides the run's one terminal event from how
``drive`` ends: it returns (``run.done``), raises a :class:`~relay_jupyter.core.errors.Refusal`
(``run.error``; ``GateRefusal(BUDGET_EXCEEDED)`` is ``run.budget_exhausted``) or is cancelled
(``run.cancelled``: an engine that runs a subprocess kills it, and its children, before it re-raises).

Engines: ``relay`` (``runtime/relay_loop.RelayLoopEngine``, the built-in loop over a model backend) and ``claude-code``
(``relay_jupyter/engines/claude_code.py``, Claude Code driven through claude-agent-sdk). Their names are
``protocol/run_choices.ENGINE_NAMES`` (``run.start``'s ``engine``); ``engines/registry.py`` is the one
place an engine is registered (asserted to match that list at import).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .tools import ToolContext

if TYPE_CHECKING:
    from .manager import RunContext, RunParams, RuntimeConfig

__all__ = ["DEFAULT_ENGINE", "EngineRun", "RunEngine"]

#: The engine of a run that names none (``c.RelayApp.default_engine`` overrides it).
DEFAULT_ENGINE = "relay"


@dataclass
class EngineRun:
    """One run, as an engine sees it: who it is for, what to run, and the broker's parts it must use."""

    run_id: str
    ctx: RunContext
    params: RunParams
    tool_ctx: ToolContext
    config: RuntimeConfig
    gate: Any
    executor: Any
    """``runtime.executor.Executor``: the one pipeline every tool call goes through."""
    emit: Callable[[str, dict[str, Any]], None]
    """Append one event of this run (``run_id`` is added)."""
    text: Callable[[str], None]
    """Emit streamed assistant text (``run.text_delta``); a store failure raises from it."""
    begin: Callable[[], list[dict[str, Any]]] = list
    """Load the conversation, append this run's prompt (with its attachments), store it; returns the
    history (Anthropic-shaped messages)."""
    add: Callable[[dict[str, Any]], None] = lambda message: None
    """Append one message to the conversation (e.g. the assistant's answer) and store it."""
    state: Any = None
    """The manager's own record of the run (the built-in engine drives it; others ignore it)."""
    steps: Callable[[], int] = lambda: 0
    step: Callable[[], int] = lambda: 0
    """Count one model request against ``config.max_steps`` and emit ``run.step`` (raises
    ``GateRefusal(BUDGET_EXCEEDED)`` past the cap); returns the step number."""
    save: Callable[[], None] = lambda: None
    """Store what the engine appended to ``state.history`` (append-only: only the new messages)."""
    begin_async: Callable[..., Awaitable[list[dict[str, Any]]]] | None = None
    """``begin`` with its store calls (the load, the save) off the event loop (runtime/offload.py); None:
    the engine calls ``begin`` on the loop. ``begin_async(store=False)`` leaves the save to the engine, which
    calls ``save`` on a store thread in its next store call, before it asks the model anything (one thread hop
    fewer before the first request)."""
    save_async: Callable[[], Awaitable[None]] | None = None
    """``save`` off the event loop; None: ``save`` on the loop."""
    first: Callable[[], Awaitable[Any]] | None = None
    """The result of the engine's optional ``prepare`` work (see :class:`RunEngine`), waited for; None without
    one. Raises what the work raised; when the run is cancelled meanwhile, the result's ``undo()`` runs first."""
    settled: Callable[[Any, Any, BaseException | None], None] = lambda reservation, turn, ended: None
    """Called once a model request is settled (``reservation``, the ``TurnResult``, how it ended or None):
    the broker's telemetry row of the turn."""


@runtime_checkable
class RunEngine(Protocol):
    """What drives a run. Stateless across runs: one instance serves every run of the broker."""

    name: str

    def check(self, params: RunParams) -> None:
        """Refuse a run this engine cannot do, before it starts (``ConfigRefusal``: a missing backend,
        a model not allowed, an extra not installed), with a one-line message saying how to fix it."""
        ...

    async def drive(self, run: EngineRun) -> None:
        """Run to the end (see the module docstring for how the ending decides the terminal event)."""
        ...

    # Optional: ``prepare(run: EngineRun) -> Callable[[], Any]``, called on the loop by ``run.start`` before its
    # store call; the function it returns runs on that store thread right after the run is journalled, while
    # the loop answers ``run.start`` (one thread hop for the start and the engine's first store work, issue
    # 18). It may call ``run.begin()`` (its events are appended once the run takes the result), the gate and
    # the store, nothing of the loop. ``drive`` gets its result from ``await run.first()``; an object with an
    # ``undo()`` is undone (on a store thread) when the run is cancelled before it used it.
