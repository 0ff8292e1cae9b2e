"""Runtime overhead: deltas/s and time to first delta through a whole run (RunManager -> backend ->
coalescer -> events) against the direct SDK stream from the same FakeAnthropic, in the same run."""

from __future__ import annotations

import asyncio
import statistics
import time

N_WORDS = 12000
#: Interleaved rounds; medians are reported (single runs swing 2x on a shared 2-core machine).
ROUNDS = 7


async def _direct(fake, key: str) -> tuple[float, float, int]:
    import anthropic

    client = anthropic.AsyncAnthropic(api_key=key, base_url=fake.base_url, max_retries=0)
    t0 = time.perf_counter()
    first = None
    n = 0
    stream = await client.messages.create(model="claude-bench", max_tokens=10_000, stream=True,
                                          messages=[{"role": "user", "content": "go"}])
    async for ev in stream:
        if ev.type == "content_block_delta":
            n += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    await client.close()
    return n / (end - t0), (first - t0) * 1000, n


async def _runtime(fake, key: str) -> tuple[float, float, int]:
    from tests.runtime.rig import make_rig

    rig = make_rig("anthropic", fake)
    t0 = time.perf_counter()
    run_id = await rig.manager.start(rig.ctx(), rig.params(model="claude-bench"))
    await rig.events.wait_for("run.text_delta", run_id, timeout=30)
    first = time.perf_counter()
    await rig.events.terminal(run_id, timeout=60)
    end = time.perf_counter()
    return N_WORDS / 3 / (end - t0), (first - t0) * 1000, len(rig.events.of("run.text_delta", run_id))


def run(report) -> None:
    """Report runtime deltas/s vs direct (target >= 0.9x) and added time to first delta (<= 5 ms)."""
    from relay_jupyter.testing import FakeAnthropic, Reply, text

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.runtime.rig import KEY as key  # the rig's backend authenticates with this key
    reply = Reply(text("word " * N_WORDS), chunk_tokens=3)
    with FakeAnthropic(api_key=key) as fake:
        async def both():
            fake.enqueue(reply, reply)
            await _direct(fake, key)  # warm-up (imports, connections)
            await _runtime(fake, key)
            rounds = []
            for _ in range(ROUNDS):  # interleaved: both sides see the same moments of a shared machine
                fake.enqueue(reply, reply)
                rounds.append((*(await _direct(fake, key))[:2], *(await _runtime(fake, key))))
            med = [statistics.median(r[k] for r in rounds) for k in range(5)]
            return med[0], med[1], med[2], med[3], rounds[-1][4]

        d_rate, d_first, r_rate, r_first, events = asyncio.run(both())
    # ratio value/baseline: the runtime's rate must stay >= 0.9x of the direct stream's
    report("runtime deltas/s vs direct SDK", r_rate, d_rate, "deltas/s")
    report("runtime added time to first delta", max(r_first - d_first, 0.0) + 5.0, 5.0, "ms (+5 offset)",
           target=2.0)
    report("runtime delta events emitted (coalesced) per model delta", events, N_WORDS / 3, "events", target=1.0)


if __name__ == "__main__":
    def _print(name, value, baseline, unit, target=None):
        print(f"{name}: {value:.2f} vs {baseline:.2f} {unit} ratio {value / baseline:.3f}"
              + (f" (target <= {target})" if target else ""))

    run(_print)
