"""Attack: spend one small day budget through every door at once.

One origin (``daemon:agent``) of a real ``jupyter relay serve`` with a day budget that fits a few requests is
driven at the same moment through its three ways to a model: the Anthropic-compatible endpoint (official SDK),
the OpenAI-compatible endpoint (official SDK) and ``%%agent``-style runs over the RPC (``run.start``). Every
upstream answer reports absurd usage, so each forwarded request is charged its whole reservation — the most a
request may cost — and the upstreams answer slowly, so the reservations overlap. Each door has its own test of
concurrency (docs/security.md, "The gate"); here they race each other on one ledger. Held: the ledger never
passes the limit, nothing is left held, every refusal is ``BUDGET_EXCEEDED`` and the upstreams saw only the
requests that were let through.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from daemon_harness import Daemon, run_cli, start_daemon

from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply, Usage, text

pytestmark = pytest.mark.slow

KEY_A = "sk-ant-attack-budget-upstream-0123456789"
KEY_O = "sk-openai-attack-budget-upstream-0123456789"
MODEL_A, MODEL_O = "claude-test-1", "gpt-test-1"
LIMIT = 10000
EACH = 6  # per door
ABSURD = Usage(input_tokens=10**9, output_tokens=10**9)


def test_one_day_budget_holds_across_the_rpc_and_both_model_endpoints(tmp_path: Path) -> None:
    slow = dict(usage=ABSURD, first_token_delay=0.4)
    with FakeAnthropic(api_key=KEY_A, models=(MODEL_A,), default=Reply(text("spent"), **slow)) as fake_a, \
            FakeOpenAI(api_key=KEY_O, models=(MODEL_O,), default=Reply(text("spent"), **slow)) as fake_o:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({
            "anthropic_api_key": KEY_A, "anthropic_base_url": fake_a.base_url,
            "openai_api_key": KEY_O, "openai_base_url": fake_o.base_url, "default_model": MODEL_A}))
        done = run_cli(tmp_path, "grants", "add", "daemon:agent", "--tools", "*", "--models", "*",
                       "--budget", f"tokens={LIMIT},cost=none,rpm=none,steps=none,run_tokens=none")
        assert done.returncode == 0, done.stderr
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        try:
            token, base = daemon.token(), f"http://127.0.0.1:{daemon.port}/relay"
            headers = {"X-Relay-Client": "agent"}
            a_client = anthropic.Anthropic(api_key=token, base_url=base + "/anthropic", default_headers=headers,
                                           max_retries=0, timeout=60)
            o_client = openai.OpenAI(api_key=token, base_url=base + "/openai/v1", default_headers=headers,
                                     max_retries=0, timeout=60)
            outcomes: list[tuple[str, str]] = []
            run_ids: list[str] = []
            lock = threading.Lock()
            go = threading.Event()

            def via_anthropic() -> None:
                go.wait()
                try:
                    a_client.messages.create(model=MODEL_A, max_tokens=400,
                                             messages=[{"role": "user", "content": "spend"}])
                    result = "ok"
                except anthropic.APIStatusError as exc:
                    result = "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in str(exc) else f"other: {exc}"
                with lock:
                    outcomes.append(("anthropic", result))

            def via_openai() -> None:
                go.wait()
                try:
                    o_client.chat.completions.create(model=MODEL_O, max_tokens=400,
                                                     messages=[{"role": "user", "content": "spend"}])
                    result = "ok"
                except openai.APIStatusError as exc:
                    result = "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in str(exc) else f"other: {exc}"
                with lock:
                    outcomes.append(("openai", result))

            def via_rpc(n: int) -> None:
                go.wait()
                answer = daemon.rpc("run.start", {"conversation": f"race{n}", "prompt": "spend",
                                                    "model": MODEL_A, "max_tokens": 400, "mode": "full"})
                with lock:
                    if "result" in answer:
                        run_ids.append(answer["result"]["run_id"])
                    else:
                        outcomes.append(("rpc", "BUDGET_EXCEEDED" if answer["error"]["data"].get("code")
                                         == "BUDGET_EXCEEDED" else f"other: {answer}"))

            threads = [threading.Thread(target=f, args=a) for i in range(EACH)
                       for f, a in ((via_anthropic, ()), (via_openai, ()), (via_rpc, (i,)))]
            for t in threads:
                t.start()
            go.set()
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads)

            deadline = time.monotonic() + 90
            runs: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                runs = [daemon.rpc("runs.get", {"run_id": r})["result"]["run"] for r in run_ids]
                if all(r["state"] not in ("running", "pending", "waiting") for r in runs):
                    break
                time.sleep(0.2)
            states = [r["state"] for r in runs]
            assert all(s in ("done", "budget_exhausted") for s in states), states

            usage = daemon.rpc("budget.get", {})["result"]["usage"]
        finally:
            daemon.stop()

    others = [o for o in outcomes if o[1] not in ("ok", "BUDGET_EXCEEDED")]
    assert not others, others
    passed = sum(o[1] == "ok" for o in outcomes) + states.count("done")
    refused = sum(o[1] == "BUDGET_EXCEEDED" for o in outcomes) + states.count("budget_exhausted")
    assert passed >= 1 and refused >= 1, (outcomes, states)  # the limit was contested
    assert usage["tokens_limit"] == LIMIT
    assert usage["tokens"] <= LIMIT, usage  # the attack: three doors never pass one day together
    assert usage["reserved_tokens"] == 0, usage  # nothing left held after every request ended
    forwarded = len([r for r in fake_a.requests if r.path.endswith("/messages")]) + \
        len([r for r in fake_o.requests if r.path.endswith("/chat/completions")])
    assert forwarded == passed, (forwarded, passed, outcomes, states)  # a refusal reached no upstream
