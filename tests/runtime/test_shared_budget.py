"""Two broker processes on one data dir share one origin's day budget: 20 concurrent runs (10 in each
process) against a day that fits a few requests. Every request reports absurd usage, so each is
charged its whole reservation — the most a request can cost — and the ledger must still end within
the limit. Before budget holds lived in the store, each process checked only its own holds."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.budgets import utc_day
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply, Usage

HERE = Path(__file__).parent
KEY = "sk-test-shared-budget-0123456789"
ORIGIN = "notebook:shared.ipynb#k1"
MODEL = "claude-test-1"
RUNS_EACH = 10


def _audit(data: Path) -> list[dict]:
    records = []
    for path in sorted(data.glob("audit-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["tool"] == f"model:{MODEL}"]


async def _broker(data: Path, root: Path, fake: FakeAnthropic, name: str, go: Path,
                  stderr: Path) -> asyncio.subprocess.Process:
    with stderr.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "budget_broker.py"), "--data-dir", str(data), "--root", str(root),
            "--base-url", fake.base_url, "--origin", ORIGIN, "--model", MODEL, "--runs", str(RUNS_EACH),
            "--name", name, "--go", str(go), stdout=asyncio.subprocess.PIPE, stderr=err,
            env={**os.environ, "RELAY_TEST_KEY": KEY})


async def _states(child: asyncio.subprocess.Process, stderr: Path) -> dict[str, str]:
    out, _ = await asyncio.wait_for(child.communicate(), 180)
    if child.returncode != 0 or not out.strip():
        pytest.fail(f"a broker child failed ({child.returncode}):\n" + stderr.read_text(errors="replace")[-4000:])
    return json.loads(out.decode().strip().splitlines()[-1])["states"]


async def _run_both(tmp_path: Path, fake: FakeAnthropic, limit: int | None) -> tuple[dict[str, str], Path]:
    data, root = tmp_path / "relay", tmp_path / "root"
    data.mkdir(mode=0o700, parents=True)
    root.mkdir()
    with Store.open(data / "relay.db") as store:
        GrantBook(store).issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}),
                                     consent_id="shared-budget",
                                     budget=Budget(requests_per_minute=None, tokens_per_day=limit,
                                                   cost_per_day_usd=None, max_tokens_per_run=None)))
    go = tmp_path / "go"
    children = [await _broker(data, root, fake, name, go, tmp_path / f"{name}.stderr") for name in ("a", "b")]
    try:
        # both processes are up (store open, runtime installed) before the runs start together
        async with asyncio.timeout(60):
            while not all(Path(f"{go}.{name}.ready").exists() for name in ("a", "b")):
                if any(c.returncode is not None for c in children):
                    break
                await asyncio.sleep(0.05)
        go.touch()
        states: dict[str, str] = {}
        for name, child in zip(("a", "b"), children, strict=True):
            states.update(await _states(child, tmp_path / f"{name}.stderr"))
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    return states, data


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_brokers_on_one_data_dir_never_pass_the_day_limit(tmp_path):
    absurd = Reply("word " * 30, tokens_per_second=300, usage=Usage(input_tokens=10**12, output_tokens=10**12))
    with FakeAnthropic(api_key=KEY, default=absurd) as fake:
        # a first pass without a limit measures what one request reserves in this configuration
        probe, probe_data = await _run_both(tmp_path / "probe", fake, None)
        assert set(probe.values()) == {"done"}
        allows = [r for r in _audit(probe_data) if r["decision"] == "allow"]
        assert len(allows) == 2 * RUNS_EACH
        per_request = max(r["arguments"]["estimated_tokens"] for r in allows)
        # room for 4.5 requests: if either process ignored the other's holds, far more would pass
        limit = per_request * 9 // 2
        states, data = await _run_both(tmp_path / "limited", fake, limit)

    counts = {s: list(states.values()).count(s) for s in set(states.values())}
    assert len(states) == 2 * RUNS_EACH
    assert counts.get("done", 0) == 4 and counts.get("budget_exhausted", 0) == 2 * RUNS_EACH - 4, counts
    with Store.open(data / "relay.db") as store:
        day = utc_day(__import__("time").time())
        tokens, _ = store.usage(ORIGIN, day)
        assert tokens <= limit
        assert store.held(ORIGIN, day) == (0, 0.0)
    settled = [r for r in _audit(data) if r["decision"] == "settled"]
    assert all(r["arguments"]["basis"] == "clamped" for r in settled)
    assert sum(r["arguments"]["tokens"] for r in settled) == tokens
    # runs of both processes got through: they shared the budget, neither starved the other entirely
    # (which process wins which request is up to the race; the total is what the limit bounds)
    assert len(settled) == 4
