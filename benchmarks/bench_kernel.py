"""A 20,000-delta answer through broker -> kernel -> iopub, against the direct SDK stream.

Figures (lower is better, as the runner expects):

- ``time per model delta``: wall time of the whole ``%%agent`` cell divided by the model's text
  deltas, against the anthropic SDK reading the same reply from the same fake server directly;
- ``output messages per second``: display/update messages the cell sent per second of streaming,
  against the coalescing bound (1 / update_interval = 10/s; finished blocks add one each);
- ``iopub bytes / answer bytes``: target at most 3.

The stack is a real Jupyter server with the relay extension (broker + runtime), FakeAnthropic as the
model and a kernel started by that server. If the server has no runtime wired, the scripted broker
of ``tests/kernel/fake_broker.py`` replays the same deltas instead (the figure names say so).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N_DELTAS = 20_000
MODEL = "claude-fake-1"


def _answer_words() -> str:
    words = ["alpha", "beta", "gamma", "delta", "`x<y`", "**bold**", "epsilon."]
    parts = []
    for i in range(N_DELTAS):
        parts.append(words[i % len(words)])
        if i % 97 == 96:
            parts.append("\n\n")
    return " ".join(parts)


async def _sdk_rate(base_url: str) -> tuple[float, int]:
    import anthropic

    client = anthropic.AsyncAnthropic(api_key="test-key", base_url=base_url, max_retries=0)
    started = time.perf_counter()
    deltas = 0
    stream = await client.messages.create(model=MODEL, max_tokens=64_000, stream=True,
                                          messages=[{"role": "user", "content": "go"}])
    async for event in stream:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            deltas += 1
    await client.close()
    return time.perf_counter() - started, deltas


def _iopub(msgs: list[dict[str, Any]]) -> tuple[int, int]:
    outputs = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data", "stream")]
    size = sum(len(json.dumps(m["header"], default=str)) + len(json.dumps(m["parent_header"], default=str))
               + len(json.dumps(m["metadata"])) + len(json.dumps(m["content"])) for m in outputs)
    return len(outputs), size


def run(report: Any) -> None:
    from relay_jupyter.testing import FakeAnthropic, Reply, text
    from tests.kernel.conftest import execute, start_kernel
    from tests.kernel.fake_broker import FakeBroker
    from tests.kernel.real_server import RealServer

    answer = _answer_words()
    with FakeAnthropic(api_key="test-key") as fake, tempfile.TemporaryDirectory() as tmp:
        fake.enqueue(Reply(text(answer), chunk_tokens=1))
        sdk_time, n_deltas = asyncio.run(_sdk_rate(fake.base_url))
        label = ""
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL}
        with RealServer(Path(tmp), config) as srv:
            kc = srv.kernel_for("bench.ipynb")
            execute(kc, "%load_ext relay_jupyter\n")
            execute(kc, "s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
                        "await (await s.get_client()).call('grants.create', {'tools': ['*'], 'models': ['*'], "
                        "'budget': {'tokens_per_day': 100000000, 'cost_per_day_usd': 100000.0, "
                        "'max_tokens_per_run': 100000000}})")
            fake.enqueue(Reply(text(answer), chunk_tokens=1))
            started = time.perf_counter()
            reply, msgs = execute(kc, "%%agent --max-tokens 64000\ngo", timeout=600)
            cell_time = time.perf_counter() - started
        if reply["status"] != "ok":
            # no runtime in the server yet: replay the SDK's deltas through the scripted broker
            label = " (scripted broker)"
            deltas = answer.split(" ")
            deltas = [w + " " for w in deltas]
            with FakeBroker() as broker:
                km, kc = start_kernel(broker.env(), tmp)
                try:
                    execute(kc, "%load_ext relay_jupyter")
                    broker.script([("texts", deltas)])
                    started = time.perf_counter()
                    reply, msgs = execute(kc, "%%agent\ngo", timeout=600)
                    cell_time = time.perf_counter() - started
                finally:
                    kc.stop_channels()
                    km.shutdown_kernel(now=True)
    n_out, size = _iopub(msgs)
    answer_bytes = len(answer.encode())
    report(f"time per model delta, %%agent cell vs SDK{label}", cell_time / n_deltas * 1e6,
           sdk_time / n_deltas * 1e6, "us/delta")
    report(f"output messages per second{label}", n_out / cell_time, 10.0, "msg/s")
    report(f"iopub bytes / answer bytes{label}", float(size), float(answer_bytes), "bytes", target=3.0)
