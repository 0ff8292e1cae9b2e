"""A turn shares the broker's event loop (issue 18): a stream whose events are already buffered never suspends
the task by itself, so the driver yields once a slice is used up, and never when the stream really waits.

The streams here are deterministic stand-ins for the socket: one never suspends (every event already
buffered, what a fast answer is), one suspends between events (a paced answer). No timing is asserted:
a zero-length slice makes every yield decision visible as a count.
"""

from __future__ import annotations

import asyncio

import pytest

from relay_jupyter.backends.base import Stop, TextDelta
from relay_jupyter.runtime.driver import Coalescer, LoopShare, TurnResult, drive_turn

pytestmark = pytest.mark.asyncio

EVENTS = 1000


class _Stream:
    """A backend whose turn is ``EVENTS`` text deltas and a stop; ``waits``: suspend between events."""

    def __init__(self, waits: bool) -> None:
        self.waits = waits

    def stream_turn(self, model, system, messages, tools, max_tokens):
        async def events():
            for i in range(EVENTS):
                if self.waits:
                    await asyncio.sleep(0)
                yield TextDelta(f"w{i} ")
            if self.waits:
                await asyncio.sleep(0)
            yield Stop("end_turn")
        return events()


class _Counting(LoopShare):
    yields = 0

    async def checkpoint(self) -> None:
        if self.due():
            self.yields += 1
            await asyncio.sleep(0)
            self._begin(asyncio.get_running_loop().time())


async def _turn(waits: bool) -> tuple[TurnResult, int, int]:
    loop = asyncio.get_running_loop()
    ticks = 0

    async def other_task():  # anything else on the loop: an SSE write, an RPC, another run
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    start = ticks
    share = _Counting(loop, after=0.0)
    flushed: list[str] = []
    result = await drive_turn(_Stream(waits), model="m", system="", messages=[], tools=[], max_tokens=10,
                              coalescer=Coalescer(flushed.append, interval=3600), result=TurnResult(),
                              share=share)
    ran = ticks - start
    ticker.cancel()
    assert "".join(flushed) == "".join(f"w{i} " for i in range(EVENTS)) == result.text  # nothing lost
    assert result.stop == "end_turn" and result.events == EVENTS + 1 and not result.incomplete
    return result, ran, share.yields


async def test_a_buffered_stream_lets_the_other_tasks_run():
    _, ran, yields = await _turn(waits=False)
    # without the driver's yields a never-suspending stream runs to its end in one step: ran == 0
    assert yields >= EVENTS // 2 - 1
    assert ran >= EVENTS // 2 - 1


async def test_a_stream_that_waits_is_never_made_to_yield():
    _, ran, yields = await _turn(waits=True)
    assert yields == 0  # the loop ran between every two events: no slice ever used up
    assert ran >= EVENTS  # the other task ran at each of the stream's own waits


async def test_a_cancel_during_a_yield_keeps_what_was_streamed():
    """Cancelled while yielding, the turn is incomplete and has counted every event it processed (the
    answer had begun: charged as interrupted, never as not started)."""
    loop = asyncio.get_running_loop()
    result = TurnResult()
    task = asyncio.create_task(drive_turn(_Stream(False), model="m", system="", messages=[], tools=[],
                                          max_tokens=10, coalescer=Coalescer(lambda _t: None, interval=3600),
                                          result=result, share=LoopShare(loop, after=0.0)))
    for _ in range(20):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert result.incomplete and 0 < result.events < EVENTS
    assert len(result.text_parts) == result.events
