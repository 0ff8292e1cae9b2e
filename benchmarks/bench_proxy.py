"""The Anthropic-compatible endpoint's cost: the official SDK through a real ``jupyter relay serve`` (TCP,
token as the API key) against the same SDK straight to the same FakeAnthropic, in interleaved rounds.

Reported (medians of ROUNDS interleaved rounds; never best-of): streamed deltas/s through relay vs direct,
the time to first delta relay adds, and the latency a small non-streamed request adds (gate + reservation +
audit + settle + one more HTTP hop).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

N_WORDS = 12000
ROUNDS = 7
SMALL = 20
KEY = "sk-ant-bench-proxy-0123456789abcdef"
MODEL = "claude-bench-1"


def _stream(client) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    n = 0
    with client.messages.stream(model=MODEL, max_tokens=20_000, messages=[{"role": "user", "content": "go"}]) as s:
        for _ in s.text_stream:
            n += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return n / (end - t0), (first - t0) * 1000


def _small(client) -> float:
    t0 = time.perf_counter()
    for _ in range(SMALL):
        client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    return (time.perf_counter() - t0) / SMALL * 1000


def run(report) -> None:
    import anthropic

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests" / "daemon"))
    from daemon_harness import run_cli, start_daemon

    from relay_jupyter.testing import FakeAnthropic, Reply, text

    big = Reply(text("word " * N_WORDS), chunk_tokens=3)
    tiny = Reply(text("ok"))
    with tempfile.TemporaryDirectory() as tmp, FakeAnthropic(api_key=KEY, models=(MODEL,)) as fake:
        tmp_path = Path(tmp)
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url}))
        run_cli(tmp_path, "grants", "add", "daemon:bench", "--tools", "*", "--models", MODEL,
                "--budget", "tokens=none,cost=none,rpm=none")
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        try:
            direct = anthropic.Anthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
            relay = anthropic.Anthropic(api_key=daemon.token(), base_url=f"http://127.0.0.1:{daemon.port}/relay/anthropic",
                                        default_headers={"X-Relay-Client": "bench"}, max_retries=0)
            fake.enqueue(big, big, *([tiny] * (2 * SMALL)))
            _stream(direct), _stream(relay), _small(direct), _small(relay)  # warm-up: imports, connections
            rounds = []
            for _ in range(ROUNDS):  # interleaved: both sides see the same moments of a shared machine
                fake.enqueue(big, big, *([tiny] * (2 * SMALL)))
                d_rate, d_first = _stream(direct)
                r_rate, r_first = _stream(relay)
                rounds.append((d_rate, d_first, r_rate, r_first, _small(direct), _small(relay)))
            med = [statistics.median(r[k] for r in rounds) for k in range(6)]
        finally:
            daemon.stop()
    report("proxy streamed deltas/s vs direct SDK", med[2], med[0], "deltas/s")
    report("proxy added time to first delta", max(med[3] - med[1], 0.0) + 5.0, 5.0, "ms (+5 offset)", target=2.0)
    report("proxy small request latency vs direct", med[5], med[4], "ms", target=2.0)


if __name__ == "__main__":
    def _print(name, value, baseline, unit, target=None):
        print(f"{name}: {value:.2f} vs {baseline:.2f} {unit} ratio {value / baseline:.3f}"
              + (f" (target <= {target})" if target else ""))

    run(_print)
