"""run.start -> the model request at the fake, and -> the first text delta on the SSE stream, through real
``jupyter relay serve`` daemons of one or more source trees, interleaved with the direct SDK (its client
built once, warm), medians of the rounds, with the load average. An A/B tool for the time before the first
model request (issue 18; docs/runtime.md "Hops before the first request"), not a ``bench_*`` of run.py:

    git archive <old> | tar -x -C /tmp/old
    .venv/bin/python benchmarks/first_request_ab.py 25 old=/tmp/old new=$PWD

Each tree's daemon runs with ``PYTHONPATH=<tree>`` (SQLite store in a temporary data dir, the kernel's
``RelayClient`` over TCP with the daemon's token, one ``daemon:bench`` grant); the fake answers 20 words.
"""
import asyncio, json, os, statistics, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "daemon"))
from daemon_harness import run_cli, start_daemon  # noqa: E402

KEY = "sk-ant-bench-daemon-0123456789abcdef"
MODEL = "claude-bench-1"
TERMINAL = {"run.done", "run.cancelled", "run.error", "run.budget_exhausted", "run.interrupted"}


def main() -> None:
    rounds = int(sys.argv[1])
    trees = dict(a.split("=", 1) for a in sys.argv[2:])
    import anthropic
    from relay_jupyter.kernel.client import Endpoint, RelayClient
    from relay_jupyter.storage.paths import ensure_private_dir
    from relay_jupyter.testing import FakeAnthropic, Reply, text

    reply = Reply(text("word " * 20), first_token_delay=0.0)
    with tempfile.TemporaryDirectory() as tmp, FakeAnthropic(api_key=KEY, models=(MODEL,), default=reply) as fake:
        daemons = {}
        for name, tree in trees.items():
            os.environ["PYTHONPATH"] = tree
            root = Path(tmp) / name
            root.mkdir()
            config = root / "broker.json"
            config.write_text(json.dumps({"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                          "default_model": MODEL}))
            r = run_cli(root, "grants", "add", "daemon:bench", "--tools", "*", "--models", MODEL,
                        "--budget", "tokens=none,cost=none,rpm=none")
            assert r.returncode == 0, r.stderr
            ensure_private_dir(root / "data" / "relay")
            daemons[name] = start_daemon(root, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        os.environ.pop("PYTHONPATH", None)

        def req_after(n0: int) -> float:
            for rec in fake.requests[n0:]:
                if rec.method == "POST" and rec.path.rstrip("/") == "/v1/messages":
                    return rec.received_at
            return float("nan")

        async def probes():
            sdk = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
            clients = {}
            for name, d in daemons.items():
                ep = Endpoint(url=f"http://127.0.0.1:{d.port}/relay/", auth=f"Bearer {d.token()}", client_name="bench")
                clients[name] = RelayClient(ep, rpc_timeout=120)
            res = {k: {"req": [], "first": []} for k in ["sdk", *daemons]}
            queues = {name: asyncio.Queue() for name in clients}
            ready = {name: asyncio.Event() for name in clients}

            async def follow(name):
                async for ev in clients[name].events():
                    if ev.get("type") == "_connected":
                        ready[name].set()
                    else:
                        queues[name].put_nowait((time.monotonic(), ev))
            tasks = [asyncio.create_task(follow(n)) for n in clients]
            for e in ready.values():
                await asyncio.wait_for(e.wait(), 30)

            async def sdk_once():
                n0 = len(fake.requests)
                t0 = time.monotonic()
                first = None
                async with sdk.messages.stream(model=MODEL, max_tokens=256,
                                               messages=[{"role": "user", "content": "go"}]) as s:
                    async for _ in s.text_stream:
                        if first is None:
                            first = time.monotonic()
                return req_after(n0) - t0, first - t0

            async def broker_once(name, i):
                n0 = len(fake.requests)
                q = queues[name]
                while not q.empty():
                    q.get_nowait()
                t0 = time.monotonic()
                r = await clients[name].call("run.start", {"conversation": f"c{i}", "prompt": "go", "model": MODEL,
                                                           "mode": "ask", "tools": []})
                rid, first = r["run_id"], None
                while True:
                    t, ev = await asyncio.wait_for(q.get(), 60)
                    if ev.get("run_id") != rid:
                        continue
                    if ev.get("type") == "run.text_delta" and first is None:
                        first = t
                    if ev.get("type") in TERMINAL:
                        assert ev["type"] == "run.done", ev
                        break
                return req_after(n0) - t0, first - t0

            for i in range(3):  # warm
                await sdk_once()
                for name in clients:
                    await broker_once(name, 1000 + i)
            order = ["sdk", *clients]
            for i in range(rounds):
                order = order[1:] + order[:1]
                for name in order:
                    a, b = await (sdk_once() if name == "sdk" else broker_once(name, i))
                    res[name]["req"].append(a)
                    res[name]["first"].append(b)
            for t in tasks:
                t.cancel()
            return res

        try:
            res = asyncio.run(probes())
        finally:
            for d in daemons.values():
                d.stop()
        la = os.getloadavg()
        print(f"rounds {rounds}, load {la[0]:.2f} {la[1]:.2f}")
        base_r, base_f = statistics.median(res["sdk"]["req"]), statistics.median(res["sdk"]["first"])
        for name, v in res.items():
            r, f = statistics.median(v["req"]), statistics.median(v["first"])
            print(f"{name:8s} request at model {r*1000:7.2f} ms (x{r/base_r:.2f})  first delta {f*1000:7.2f} ms "
                  f"(x{f/base_f:.2f})  req p10-p90 {sorted(v['req'])[len(v['req'])//10]*1000:.1f}-"
                  f"{sorted(v['req'])[len(v['req'])*9//10]*1000:.1f}")


main()
