"""Group commit of event appends (issue 18): bursts of ``run.text_delta`` from many runs in one loop turn.

64 runs each emit one coalesced delta per turn of the event loop (what 64 paced streams do when their
socket reads land in one loop iteration), over the real SQLite store and ``EventBus`` with one live
subscriber per run: ``EventBus.append`` for each (one transaction per event, before) against
``EventBus.append_soon`` (one transaction per loop turn, what the run manager does now). Wall time per
event, rounds interleaved, median of rounds. The baseline is the old path on the same store, same data.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from relay_jupyter.broker.events import EventBus
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.protocol.names import EventType
from relay_jupyter.storage.sqlite import Store

RUNS = 64
TURNS = 40
ROUNDS = 7


async def _one(bus: EventBus, soon: bool) -> float:
    text = {"text": "some words of an answer, coalesced " * 2}
    t0 = time.perf_counter()
    for _ in range(TURNS):
        for r in range(RUNS):
            if soon:
                bus.append_soon(EventType.TEXT_DELTA, {"run_id": f"r{r}", **text}, origin=f"notebook:{r}.ipynb",
                                run_id=f"r{r}", on_error=print)
            else:
                bus.append(EventType.TEXT_DELTA, {"run_id": f"r{r}", **text}, origin=f"notebook:{r}.ipynb",
                           run_id=f"r{r}")
        await asyncio.sleep(0)  # the next turn of the loop (the flush runs here)
    bus.flush()
    return (time.perf_counter() - t0) / (TURNS * RUNS)


async def _measure() -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        with Store.open(Path(tmp) / "relay.db") as store:
            bus = EventBus(store)
            subs = [bus.subscribe(Caller(kind=CallerKind.KERNEL, origin=f"notebook:{r}.ipynb", client_id=f"k{r}"),
                                  maxsize=1_000_000) for r in range(RUNS)]
            old, new = [], []
            for n in range(ROUNDS):
                for soon in ((False, True) if n % 2 == 0 else (True, False)):
                    (new if soon else old).append(await _one(bus, soon))
                    for s in subs:
                        s.drain()
            return statistics.median(new), statistics.median(old), bus.group_commits


def run(report) -> None:
    new, old, commits = asyncio.run(_measure())
    report(f"{RUNS} runs' text deltas per loop turn: group commit vs a transaction per event "
           f"({commits} group commits)", new * 1e6, old * 1e6, "µs/event")


if __name__ == "__main__":  # pragma: no cover - manual run
    run(lambda name, v, b, unit, target=None: print(f"{name}: {v:.1f} vs {b:.1f} {unit} = {v / b:.2f}×"))
