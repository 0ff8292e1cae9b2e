"""SSE relay vs reading the bus directly (issue 3 benchmark).

1. Throughput: 20,000 small events appended in batches of 100 to a broker with the SQLite store, read
   (a) directly by an in-process bus subscriber and (b) through the real SSE handler
   (``server/plain.py`` on 127.0.0.1, a raw socket client counting frames). Same producer, same store.
   Reported as time (lower is better); target <= 1/0.9 of the direct time (rate >= 0.9x).
2. Latency: 500 events/s for 4 s, one event at a time. Every event is received both by a direct
   in-process subscriber and, through the handler, by an SSE client in its *own process* (as a
   kernel or a browser is); both note ``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for the
   whole machine) on receipt. The added latency of an event is (SSE receipt - direct receipt); the
   figure is its p99 per run, over ``LAT_ROUNDS`` runs: the **median run** and the **worst run** are
   reported (never the best of them; issue 18). Target: the median run <= 2 ms (reported against a
   2 ms baseline, so the ratio target is 1.0); the worst run has no target.

   Why not the earlier method (the SSE client in the server's own event loop, and p99 of a separate
   SSE run minus p99 of a separate direct run): instrumenting it showed the handler's part (offer
   to ``send()``) at p99 0.2-0.35 ms, while (``send()`` to the in-loop client's read) had p99 1-6 ms:
   the benchmark's client waiting for the loop it shares with the server, not the handler. Two
   separate 4 s runs on a shared machine also differ by more than the target (their p99s ranged
   1.2-4.1 ms for the same direct path). The old figure is still printed to stderr.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.protocol.sse import parse_stream
from relay_jupyter.server.plain import make_app

N = 20_000
BATCH = 100
RATE = 500
SECONDS = 4
LAT_ROUNDS = 5

# The SSE client of the latency figure, run in its own process: reads the stream, notes when each
# "lat" frame arrives, prints {id: perf_counter} as JSON when it has them all.
_CLIENT = r"""
import json, socket, sys, time
port, since, want = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(f"GET /relay/events?since={since} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
print("connected", flush=True)
got, buf = {}, b""
while len(got) < want:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    now = time.perf_counter()
    buf += chunk
    while b"\nevent: lat\n" in buf:
        head, _, buf = buf.partition(b"\nevent: lat\n")
        got[int(head.rsplit(b"id: ", 1)[1])] = now
print(json.dumps(got), flush=True)
"""
CALLER = Caller(kind=CallerKind.DAEMON, origin="daemon:bench", client_id="daemon:bench:1")


async def _produce_batches(broker: Broker) -> None:
    for start in range(0, N, BATCH):
        broker.events.append_many([("bench", {"n": n}, None, None) for n in range(start, start + BATCH)])
        await asyncio.sleep(0)


async def _direct_throughput(broker: Broker) -> float:
    sub = broker.events.subscribe(CALLER, maxsize=N + 1)
    got = 0
    t0 = time.perf_counter()
    producer = asyncio.create_task(_produce_batches(broker))
    while got < N:
        await sub.wait(5)
        got += len(sub.drain())
    elapsed = time.perf_counter() - t0
    await producer
    broker.events.unsubscribe(sub)
    return elapsed


async def _open_sse(port: int, since: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /relay/events?since={since} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    return reader, writer


async def _sse_throughput(broker: Broker, port: int) -> float:
    reader, writer = await _open_sse(port, broker.events.last_event_id())
    while broker.events.subscribers == 0:
        await asyncio.sleep(0.001)
    got = 0
    t0 = time.perf_counter()
    producer = asyncio.create_task(_produce_batches(broker))
    while got < N:
        got += (await reader.read(1 << 20)).count(b"\nevent: bench\n")
    elapsed = time.perf_counter() - t0
    await producer
    writer.close()
    return elapsed


async def _latency(broker: Broker, port: int | None) -> list[float]:
    delays: list[float] = []
    if port is None:
        sub = broker.events.subscribe(CALLER, maxsize=RATE * SECONDS + 1)

        async def consume() -> None:
            while len(delays) < RATE * SECONDS:
                await sub.wait(5)
                now = time.perf_counter()
                for _, frame in sub.drain():
                    frames, _ = parse_stream(frame.decode())
                    delays.append(now - float(frames[0]["data"].split('"t":')[1].split("}")[0]))
    else:
        reader, writer = await _open_sse(port, broker.events.last_event_id())
        while broker.events.subscribers == 0:
            await asyncio.sleep(0.001)

        async def consume() -> None:
            buf = ""
            while len(delays) < RATE * SECONDS:
                buf += (await reader.read(1 << 16)).decode()
                now = time.perf_counter()
                frames, buf = parse_stream(buf)
                for f in frames:
                    if f["event"] == "lat":
                        delays.append(now - float(f["data"].split('"t":')[1].split("}")[0]))

    task = asyncio.create_task(consume())
    start = time.perf_counter()
    for i in range(RATE * SECONDS):
        await asyncio.sleep(max(0.0, start + i / RATE - time.perf_counter()))
        broker.events.append("lat", {"t": time.perf_counter()})
    async with asyncio.timeout(10):
        await task
    if port is None:
        broker.events.unsubscribe(sub)
    else:
        writer.close()
    return delays


async def _paired_latency(broker: Broker, port: int) -> tuple[float, float, float]:
    """One run: (p99 of per-event SSE - direct receipt, p99 direct delay, p99 SSE delay), seconds."""
    n = RATE * SECONDS
    sub = broker.events.subscribe(CALLER, maxsize=n + 1)
    before = set(broker.events._subscribers)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, str(port), str(broker.events.last_event_id()), str(n),
        stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            await proc.stdout.readline()
            while not set(broker.events._subscribers) - before:  # the client's subscription is live
                await asyncio.sleep(0.001)
        direct: dict[int, float] = {}

        async def consume() -> None:
            while len(direct) < n:
                await sub.wait(5)
                now = time.perf_counter()
                for i, _ in sub.drain():
                    direct[i] = now

        task = asyncio.create_task(consume())
        sent: dict[int, float] = {}
        start = time.perf_counter()
        for i in range(n):
            await asyncio.sleep(max(0.0, start + i / RATE - time.perf_counter()))
            t = time.perf_counter()
            sent[broker.events.append("lat", {"t": t}).id] = t
        async with asyncio.timeout(30):
            await task
            relayed = {int(k): v for k, v in json.loads(await proc.stdout.readline()).items()}
    finally:
        broker.events.unsubscribe(sub)
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    added = [relayed[i] - direct[i] for i in sent]
    return (_p99(added), _p99([direct[i] - t for i, t in sent.items()]),
            _p99([relayed[i] - t for i, t in sent.items()]))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker.open(BrokerConfig(data_dir=Path(tmp), sse_queue_size=N + 1, heartbeat_interval=60))
        server = make_app(broker, lambda handler: CALLER).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        try:
            direct = await _direct_throughput(broker)
            relayed = await _sse_throughput(broker, port)
            lat_direct = _p99(await _latency(broker, None))
            lat_sse = _p99(await _latency(broker, port))
            paired = [await _paired_latency(broker, port) for _ in range(LAT_ROUNDS)]
        finally:
            server.stop()
            await server.close_all_connections()
            broker.close()
    print(f"[sse] in-loop client, separate runs: p99 {lat_sse * 1e3:.2f} ms - direct p99 {lat_direct * 1e3:.2f} ms "
          f"= {(lat_sse - lat_direct) * 1e3:.2f} ms", file=sys.stderr)
    for added, d, r in paired:
        print(f"[sse] client process, paired: p99 added {added * 1e3:.2f} ms (p99 delay direct {d * 1e3:.2f} ms, "
              f"via SSE {r * 1e3:.2f} ms)", file=sys.stderr)
    added = sorted(a for a, _, _ in paired)
    return {"direct": direct, "relayed": relayed, "added_median": statistics.median(added), "added_worst": added[-1]}


def run(report) -> None:
    """Report SSE throughput vs direct reading, and p99 added latency at 500 events/s."""
    r = asyncio.run(_main())
    report("sse: 20k events through the handler (time)", r["relayed"], r["direct"], "s", target=1 / 0.9)
    report(f"sse: p99 added latency at 500 ev/s, median of {LAT_ROUNDS} runs (vs 2 ms budget)",
           max(0.0, r["added_median"] * 1000), 2.0, "ms", target=1.0)
    report(f"sse: p99 added latency at 500 ev/s, worst of {LAT_ROUNDS} runs (vs 2 ms budget)",
           max(0.0, r["added_worst"] * 1000), 2.0, "ms")


if __name__ == "__main__":
    def _print(name, value, baseline, unit, target=None):
        print(f"{name}: {value:.4g} {unit} vs {baseline:.4g} {unit} ratio {value / baseline:.3f} target {target}")

    run(_print)
