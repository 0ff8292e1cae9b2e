"""The turn driver: streams one assistant turn from a backend, coalescing text deltas, and
collects the turn's text, tool calls, usage and stop reason.

Coalescing keeps the event count bounded whatever the model's delta size: text is flushed when
``max_chars`` are buffered, when ``interval`` seconds have passed since the last flush (checked on
each delta, plus a timer so a stalled stream still shows its tail), and at the end of the turn.
Per-delta work is O(len(delta)): pieces go to a list joined only at flush time.

Sharing the loop: events the socket has already buffered are parsed without any ``await`` suspending
(the SDK's reads return at once), so a fast answer used to be one callback of 50-150 ms that froze every
other run, RPC and SSE stream of the broker (issue 18). The turn gives the loop back after every
``YIELD_AFTER`` seconds of parsing.

Deadlines: a turn has an overall deadline (``turn_timeout``) and an idle deadline
(``idle_timeout``) that only content resets — text, a tool call or a piece of one, usage —
never a keep-alive (Anthropic ``event: ping``, OpenAI ``: keep-alive`` produce no event). Reaching
either raises ``BackendFailure(BACKEND_TIMEOUT)``. Whenever a turn ends by an exception its
:class:`TurnResult` is marked ``incomplete``: the partial text is kept, and stored marked so.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend, Stop, TextDelta, ToolCallDone, UsageEvent, failure
from ..core.budgets import estimate_text_tokens
from ..core.errors import Code
from ..core.types import ToolSpec, Usage
from .call_ids import CallIds
from .tools import MAX_ARGUMENT_BYTES

__all__ = ["YIELD_AFTER", "Coalescer", "LoopShare", "TurnResult", "charge_outcome", "drive_turn",
           "streamed_output_tokens", "usage_event"]

#: Seconds a turn's stream may hold the event loop before it lets the other tasks run (issue 18: the
#: loop-lag target is 20 ms; a slice of a few ms costs one loop iteration per slice, nothing per event).
YIELD_AFTER = 0.004


class LoopShare:
    """Tells a task that has held the event loop for ``after`` seconds *without the loop running anything
    else* that it should yield. A slice begins when the object is made and at the first :meth:`due` after
    the loop ran (a ``call_soon`` marker shows it), so a stream that really waits on the network never
    yields for nothing, and a burst of buffered events yields once per slice."""

    def __init__(self, loop: asyncio.AbstractEventLoop, after: float = YIELD_AFTER) -> None:
        self._loop = loop
        self._after = after
        self._begin(loop.time())

    def _begin(self, now: float) -> None:
        self._ran = False
        self._start = now
        self._loop.call_soon(self._mark)

    def _mark(self) -> None:
        self._ran = True

    def due(self) -> bool:
        """True when the slice is used up (the caller should :meth:`checkpoint`)."""
        now = self._loop.time()
        if self._ran:  # the loop ran since the slice began: a new slice
            self._begin(now)
            return False
        return now - self._start >= self._after

    async def checkpoint(self) -> None:
        """Let the other tasks run if the slice is used up; the next slice begins on return."""
        if self.due():
            await asyncio.sleep(0)
            self._begin(self._loop.time())


class Coalescer:
    """Buffers text pieces and hands them to ``flush(text)`` in bounded batches."""

    def __init__(self, flush: Callable[[str], None], *, interval: float = 0.03, max_chars: int = 2048,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._flush = flush
        self._interval = interval
        self._max_chars = max_chars
        self._clock = clock
        self._parts: list[str] = []
        self._size = 0
        self._last = float("-inf")  # the first piece goes out at once: coalescing must not delay it
        self._timer: asyncio.TimerHandle | None = None

    def add(self, text: str) -> None:
        """Buffer ``text``; flush if the size or time bound is reached."""
        if not text:
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self._max_chars or self._clock() - self._last >= self._interval:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self.flush)

    def flush(self) -> None:
        """Hand over everything buffered (no-op when empty)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        self._last = self._clock()
        self._flush(text)

    def close(self) -> None:
        """Flush and stop the timer."""
        self.flush()


@dataclass
class TurnResult:
    """One assistant turn as streamed so far (complete when ``stop`` is set)."""

    text_parts: list[str] = field(default_factory=list)
    calls: list[ToolCallDone] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop: str | None = None
    incomplete: bool = False
    """True when the turn ended by a failure, a deadline or a cancel: the text is a partial answer."""
    events: int = 0
    """Events received from the backend (0: the answer never began; see :func:`charge_outcome`)."""
    usage_reported: bool = False
    """True once the backend sent a usage event (a llama.cpp server streaming sends none)."""
    started_at: float | None = None
    """The event loop's time when the request began (telemetry: latency)."""
    first_event_at: float | None = None
    """The event loop's time of the first backend event (telemetry: time to first token)."""

    @property
    def text(self) -> str:
        """The assistant text of the turn."""
        return "".join(self.text_parts)

    def message(self) -> dict[str, Any]:
        """The turn as a normalized assistant message (text first, then tool_use blocks)."""
        blocks: list[dict[str, Any]] = []
        if self.text:
            blocks.append({"type": "text", "text": self.text})
        for c in self.calls:
            # an oversized argument object is refused; re-sending it every turn would only burn tokens
            args = c.input if c.raw_size <= MAX_ARGUMENT_BYTES else {"omitted": "arguments over the size limit"}
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
        msg: dict[str, Any] = {"role": "assistant", "content": blocks}
        if self.incomplete:
            msg["incomplete"] = True  # stored history only: the request keeps role and content
        return msg


async def drive_turn(backend: Backend, *, model: str, system: str, messages: list[dict[str, Any]],
                     tools: Sequence[ToolSpec], max_tokens: int, coalescer: Coalescer,
                     result: TurnResult, call_ids: CallIds | None = None,
                     turn_timeout: float | None = None, idle_timeout: float | None = None,
                     share: LoopShare | None = None) -> TurnResult:
    """Stream one turn into ``result`` (filled as it goes, so a cancelled turn keeps its partial
    text). Each tool call is recorded under an id ``call_ids`` makes unique in the conversation
    (backends may reuse ids). Raises ``BackendFailure`` (``BACKEND_TIMEOUT`` at a deadline); on
    cancellation the stream is closed. ``share``: the run's :class:`LoopShare` (a new one by default)."""
    loop = asyncio.get_running_loop()
    share = LoopShare(loop) if share is None else share
    started = loop.time()
    end = started + turn_timeout if turn_timeout else float("inf")
    idle = idle_timeout if idle_timeout else float("inf")
    # one timer for both deadlines, moved forward by content only (a little slack, so that a
    # fast stream does not reschedule the timer on every delta)
    slack = min(idle / 10, 1.0)
    stream = backend.stream_turn(model, system, messages, tools, max_tokens)
    when = min(end, started + idle)
    result.started_at = started
    try:
        async with asyncio.timeout_at(when if when != float("inf") else None) as timer:
            async for event in stream:
                result.events += 1
                if result.first_event_at is None:
                    result.first_event_at = loop.time()
                if type(event) is TextDelta:
                    result.text_parts.append(event.text)
                    coalescer.add(event.text)
                elif isinstance(event, ToolCallDone):
                    result.calls.append(call_ids.claim(event) if call_ids is not None else event)
                elif isinstance(event, UsageEvent):
                    result.usage = event.usage
                    result.usage_reported = True
                elif isinstance(event, Stop):
                    result.stop = event.reason
                if idle != float("inf"):
                    now = loop.time()
                    if now + idle - when > slack:
                        when = min(end, now + idle)
                        timer.reschedule(when)
                # after the event is counted (a cancel here finds the answer begun): buffered events
                # never suspend the task, so let the others run once the slice is used up
                await share.checkpoint()
    except TimeoutError:
        result.incomplete = True
        if not timer.expired():
            raise
        if when >= end:
            raise failure(Code.BACKEND_TIMEOUT, f"the model turn took longer than turn_timeout "
                                                f"({turn_timeout:g} s)") from None
        raise failure(Code.BACKEND_TIMEOUT, f"the model server sent no content for {idle:g} s "
                                            "(turn_idle_timeout; keep-alive pings do not count)") from None
    except BaseException:
        result.incomplete = True
        raise
    finally:
        coalescer.close()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if result.stop is None:
        # every backend ends a complete turn with Stop; a stream without one was cut short
        result.incomplete = True
        raise failure(Code.BACKEND_ERROR, "the model server closed the stream before the answer ended")
    return result


# ---- what a turn is charged (the gate's settle_completion arguments) ------------------------------

def charge_outcome(result: TurnResult, exc: BaseException | None) -> str:
    """The ``outcome`` of :func:`~relay_jupyter.core.budgets.judge_usage` for a turn that ended with
    ``exc`` (None: it completed): ``complete``; ``refused`` when the server answered an HTTP error
    before any event, or could not be connected to at all (nothing was generated); ``not_started``
    when it failed or was cancelled before any event (the prompt may have been processed); else
    ``interrupted`` (the answer had begun: it may have run to ``max_tokens``)."""
    if exc is None:
        return "complete"
    if result.events == 0:
        return "refused" if getattr(exc, "status", None) or _never_connected(exc) else "not_started"
    return "interrupted"


def _never_connected(exc: BaseException) -> bool:
    # the backends say "cannot reach <server>" only when no connection was made (connect error or
    # connect timeout, backends/capped.py); a connection cut after the request went out says otherwise
    return getattr(exc, "code", None) is Code.BACKEND_UNREACHABLE \
        and str(getattr(exc, "message", "")).startswith("cannot reach")


def streamed_output_tokens(result: TurnResult, max_tokens: int) -> int:
    """A conservative token count of what the turn streamed, for a server that reports no usage:
    ``max_tokens`` when the turn stopped at that limit (the server generated exactly that many), else
    the estimate of its text and its tool calls (name and arguments)."""
    if result.stop == "max_tokens":
        return max_tokens
    n = estimate_text_tokens(result.text)
    for c in result.calls:
        n += 8 + estimate_text_tokens(c.name) + max(estimate_text_tokens(c.raw or ""), c.raw_size // 3,
                                                    estimate_text_tokens(_json_args(c.input)))
    return n


def usage_event(turn: TurnResult, reservation: Any) -> dict[str, Any]:
    """The ``run.usage`` event of a settled turn: the token counts that were *charged* (the reported
    ones, or the estimate / reservation that replaced them), ``basis`` (docs/gate.md §6) and
    ``cost_usd``. Falls back to the reported usage when the gate recorded no charge."""
    charge = getattr(reservation, "charge", None)
    if charge is None:
        return turn.usage.model_dump()
    if charge.usage is not None:
        data = charge.usage.model_dump()
    else:  # the reservation itself: its split when known
        est = getattr(reservation, "estimate", None)
        inp = est.input_tokens if est is not None else charge.tokens
        data = Usage(input_tokens=inp, output_tokens=charge.tokens - inp).model_dump()
    data["basis"] = charge.basis
    data["cost_usd"] = round(float(getattr(reservation, "charged_usd", None) or 0.0), 6)
    return data


def _json_args(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except ValueError:
        return ""
