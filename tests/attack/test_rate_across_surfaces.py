"""Attack: spend one rate limit through every door at once, the MCP gateway included.

docs/gate.md: the per-origin requests-per-minute bucket is "drawn by every tool call and every model request".
One origin (``daemon:agent``) of a real ``jupyter relay serve`` with ``rpm=5`` is driven at the same moment
through the RPC (``tools.call`` of the workspace's ``scratch_list``, a read: no card), relay's MCP gateway (the
same tool, ``tools/call`` with a ``jupyter relay mcp-token``; a gateway session has no conversation, so past the
gate the tool answers INVALID_ARGUMENTS — it drew from the bucket all the same) and the Anthropic-compatible endpoint (official
SDK, the fake Anthropic server upstream). Held: together they pass at most the bucket's five plus what it refilled
while the attack lasted; every other call is refused ``BUDGET_EXCEEDED`` on its own wire, and a refused model
request reaches no upstream. On the way, the gateway refuses every foreign ``Origin`` dressed up as loopback.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from daemon_harness import Daemon, run_cli, start_daemon

from relay_jupyter.testing import FakeAnthropic, Reply, text

pytestmark = pytest.mark.slow

KEY = "sk-ant-attack-rate-upstream-0123456789"
MODEL = "claude-test-1"
RPM = 5
EACH = 6  # per door: 18 calls against a bucket of 5


def _rpc(daemon: Daemon, method: str, params: dict[str, Any], client: str = "agent") -> dict[str, Any]:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        return conn.rpc(method, params, {"Authorization": f"Bearer {daemon.token()}", "X-Relay-Client": client})
    finally:
        conn.close()


def test_one_rate_limit_holds_across_the_rpc_the_gateway_and_the_model_endpoint(tmp_path: Path) -> None:
    with FakeAnthropic(api_key=KEY, models=(MODEL,), default=Reply(text("ok"))) as fake:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                      "default_model": MODEL}))
        (tmp_path / "cfg").mkdir()
        for origin, rpm in (("daemon:agent", RPM), ("daemon:warm", "none")):
            done = run_cli(tmp_path, "grants", "add", origin, "--tools", "scratch_list", "--models", MODEL,
                           "--budget", f"rpm={rpm},tokens=none,cost=none")
            assert done.returncode == 0, done.stderr
        minted = run_cli(tmp_path, "mcp-token", "--client", "agent")
        assert minted.returncode == 0, minted.stderr
        token = next(w for line in minted.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        try:
            base = f"http://127.0.0.1:{daemon.port}/relay"
            sdk = anthropic.Anthropic(api_key=daemon.token(), base_url=base + "/anthropic", max_retries=0,
                                      default_headers={"X-Relay-Client": "agent"}, timeout=60)
            gateway = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}",
                                                        "Accept": "application/json, text/event-stream"})
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "scratch_list", "arguments": {}}}
            # warm up (the daemon's first tools.call takes seconds) with another origin: agent's bucket stays full
            assert "result" in _rpc(daemon, "tools.call", {"conversation": "w", "tool": "scratch_list"}, "warm")
            # the gateway answers before the race (no rate drawn by tools/list or initialize)
            listing = {**call, "method": "tools/list", "params": {}}
            assert gateway.post(base + "/mcp", json=listing).status_code == 200
            # and refuses a page elsewhere however its Origin dresses up as loopback (DNS rebinding), token or not
            for origin in ("http://localhost.evil.example", "http://127.0.0.1@evil.example", "http://127.0.0.1.nip.io",
                           "null", "file://", "http://127.1", "http://0x7f000001", "http://2130706433",
                           "https://evil.example:443#http://127.0.0.1"):
                assert gateway.post(base + "/mcp", json=listing, headers={"Origin": origin}).status_code == 403, origin
            for origin in ("http://127.0.0.1:8888", "http://LOCALHOST", "http://[::1]:9"):
                assert gateway.post(base + "/mcp", json=listing, headers={"Origin": origin}).status_code == 200, origin
            outcomes: list[tuple[str, str]] = []
            lock = threading.Lock()
            go = threading.Event()

            def note(door: str, result: str) -> None:
                with lock:
                    outcomes.append((door, result))

            def via_rpc() -> None:
                go.wait()
                answer = _rpc(daemon, "tools.call", {"conversation": "race", "tool": "scratch_list"})
                if "result" in answer and not answer["result"]["is_error"]:
                    note("rpc", "ok")
                else:
                    code = (answer.get("error") or {}).get("data", {}).get("code") or \
                        answer.get("result", {}).get("content", "")
                    note("rpc", "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in json.dumps(code) else f"other: {answer}")

            def via_gateway() -> None:
                go.wait()
                body = gateway.post(base + "/mcp", json=call).json()
                result = body.get("result") or {}
                text_ = json.dumps(result.get("content"))
                if result and (not result.get("isError") or "need a conversation" in text_):
                    # past the rate: a gateway session has no conversation, so a scratch tool then refuses
                    # (INVALID_ARGUMENTS, after the gate's budget step): it drew from the bucket all the same
                    note("gateway", "ok")
                else:
                    note("gateway", "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in json.dumps(body) else f"other: {body}")

            def via_anthropic() -> None:
                go.wait()
                try:
                    sdk.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "x"}])
                    note("anthropic", "ok")
                except anthropic.APIStatusError as exc:
                    note("anthropic", "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in str(exc) else f"other: {exc}")

            threads = [threading.Thread(target=f) for _ in range(EACH) for f in (via_rpc, via_gateway, via_anthropic)]
            for t in threads:
                t.start()
            started = time.monotonic()
            go.set()
            for t in threads:
                t.join(120)
            elapsed = time.monotonic() - started
            assert not any(t.is_alive() for t in threads)
        finally:
            daemon.stop()

    assert len(outcomes) == 3 * EACH
    others = [o for o in outcomes if o[1] not in ("ok", "BUDGET_EXCEEDED")]
    assert not others, others
    passed = [o for o in outcomes if o[1] == "ok"]
    # the bucket holds RPM and refills RPM per minute: no more can pass, whichever door they use
    assert 1 <= len(passed) <= RPM + math.floor(RPM * elapsed / 60), (len(passed), elapsed, outcomes)
    forwarded = len([r for r in fake.requests if r.path.endswith("/messages")])
    assert forwarded == sum(o[0] == "anthropic" for o in passed), (forwarded, outcomes)
