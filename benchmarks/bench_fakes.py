"""The fake model servers: are they fast and faithful enough to benchmark the relay against?

- Delivery: time per text delta streamed by FakeAnthropic and read raw (httpx2, no SDK parsing),
  against the pace of the fastest real Claude stream (250 tokens/s = 4 ms per delta). Target 0.1: the
  fake must never be the bottleneck of a relay benchmark.
- Pacing: first to last delta of a stream scripted at 200 tokens/s over 200 tokens, against the ideal
  1 s. Target 1.1.
- First token: time from request to first text delta with ``first_token_delay=0.05`` on a warm
  connection, against 0.05 s. Target 1.5.
- The same delivery figure for FakeOpenAI.
"""

from __future__ import annotations

import asyncio
import time

import httpx2

from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply

BODY = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _read(h: httpx2.AsyncClient, path: str, body: dict) -> tuple[float, float, int]:
    """(seconds to first text delta, seconds from first to last delta, number of text deltas) of one
    streamed request on an already connected client."""
    t0 = time.perf_counter()
    first = last = None
    deltas = 0
    async with h.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if '"text_delta"' in line or '"content": "w' in line:
                deltas += 1
                last = time.perf_counter()
                if first is None:
                    first = last
    assert first is not None and last is not None
    return first - t0, last - first, deltas


async def _anthropic(report) -> None:
    n = 5_000
    words = " ".join(["w"] * n)
    with FakeAnthropic() as fake:
        headers = {"anthropic-version": "2023-06-01"}
        async with httpx2.AsyncClient(base_url=fake.base_url, timeout=60, headers=headers) as h:
            fake.enqueue("w w")
            await _read(h, "/v1/messages", BODY)  # warm the connection
            best = float("inf")
            for _ in range(3):
                fake.enqueue(Reply(words, chunk_tokens=1))
                first, span, deltas = await _read(h, "/v1/messages", BODY)
                assert deltas == n, deltas
                best = min(best, (first + span) / n)
            report("FakeAnthropic: time per text delta (raw read) vs real Claude at 250 tok/s", best * 1e3,
                   4.0, "ms", target=0.1)

            # 201 one-word deltas at 200 tok/s: the last leaves 1 s after the first
            fake.enqueue(Reply(" ".join(["w"] * 201), chunk_tokens=1, tokens_per_second=200))
            _, span, _ = await _read(h, "/v1/messages", BODY)
            report("FakeAnthropic: 200 tokens paced at 200 tok/s, first to last delta vs ideal", span, 1.0, "s",
                   target=1.1)

            fake.enqueue(Reply("w w w", first_token_delay=0.05))
            first, _, _ = await _read(h, "/v1/messages", BODY)
            report("FakeAnthropic: time to first delta with first_token_delay=50 ms (warm connection)",
                   first * 1e3, 50.0, "ms", target=1.5)


async def _openai(report) -> None:
    n = 5_000
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with FakeOpenAI() as fake:
        async with httpx2.AsyncClient(base_url=fake.base_url, timeout=60) as h:
            fake.enqueue(Reply(" ".join(["w"] * n), chunk_tokens=1))
            first, span, deltas = await _read(h, "/chat/completions", body)
            assert deltas == n, deltas
            report("FakeOpenAI: time per content delta (raw read) vs real model at 250 tok/s",
                   (first + span) / n * 1e3, 4.0, "ms", target=0.1)


def run(report) -> None:
    """Four figures, see the module docstring."""
    asyncio.run(_anthropic(report))
    asyncio.run(_openai(report))
