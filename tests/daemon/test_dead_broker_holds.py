"""A SIGKILLed daemon's budget holds are charged as soon as another broker on the data dir finds its lease
dead (issue 12 leftover), not only when they expire (15 minutes or more later).

Daemon b's run waits for its model's first token (the request was sent: its hold is in the store);
b is SIGKILLed. Daemon a (same data dir) finds b dead in its maintenance step and, in one transaction,
charges the hold at its reserved amount: the ledger shows the reservation as spent, nothing stays
held, and the hold had not expired. Everything is waited for as a condition on the shared store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_harness import Daemon, start_daemon, wait_for

from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Grant
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply

KEY = "sk-ant-test-holds-0123456789"

pytestmark = pytest.mark.slow

PATIENCE = 600.0
"""Every wait is for a condition (a state of the shared store, a daemon's answer); this only bounds a hang."""


def _start(tmp: Path, name: str, data: Path, fake: FakeAnthropic, **extra: object) -> Daemon:
    root = tmp / name
    root.mkdir(exist_ok=True)
    ensure_private_dir(root / "sock")
    cfg = tmp / f"broker-{name}.json"
    mcp = tmp / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {}}))
    cfg.write_text(json.dumps({"data_dir": str(data), "anthropic_base_url": fake.base_url, "anthropic_api_key": KEY,
                               "mcp_config_path": str(mcp), "default_model": "claude-test-1", **extra}))
    return start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock", "--config", str(cfg))


def _rpc(daemon: Daemon, client: str, method: str, params: dict) -> dict:
    conn = daemon.connect()
    conn.sock.settimeout(PATIENCE)
    try:
        reply = conn.rpc(method, params, {"X-Relay-Client": client})
    finally:
        conn.close()
    assert "error" not in reply, reply
    return reply["result"]


def _holds(data: Path) -> list[tuple]:
    with Store.open(data / "relay.db") as store:
        return store.query("SELECT hold_id, origin, day, tokens, cost_usd, created_at, expires_at, charged "
                           "FROM budget_holds")


def _usage(data: Path, origin: str, day: str) -> tuple[tuple[int, float], tuple[int, float]]:
    with Store.open(data / "relay.db") as store:
        return store.usage(origin, day), store.held(origin, day)


def test_a_sigkilled_daemons_holds_are_charged_when_its_lease_is_found_dead(tmp_path):
    data = ensure_private_dir(tmp_path / "shared")
    with Store.open(data / "relay.db") as store:
        for origin in ("daemon:a", "daemon:b"):
            GrantBook(store).issue(Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                         consent_id="terminal"))
    with FakeAnthropic(api_key=KEY) as fake:
        a = _start(tmp_path, "a", data, fake, lease_ttl=3)  # a checks for dead brokers every second
        b = None
        try:
            b = _start(tmp_path, "b", data, fake)
            fake.enqueue(Reply("too late", first_token_delay=3600))  # the answer never comes while b lives
            run_b = _rpc(b, "b", "run.start", {"conversation": "cb", "prompt": "go", "mode": "ask"})["run_id"]
            wait_for(lambda: len(fake.requests) >= 1, timeout=PATIENCE, what="b's model request to be sent")
            wait_for(lambda: any(h[1] == "daemon:b" and not h[7] for h in _holds(data)), timeout=PATIENCE,
                     what="b's budget hold")
            (hold,) = [h for h in _holds(data) if h[1] == "daemon:b"]
            hold_id, _, day, tokens, cost, created_at, expires_at, _ = hold
            assert tokens > 0 and cost > 0 and "@" in hold_id  # the hold names its broker's lease
            assert expires_at - created_at >= 900  # so what follows cannot be its expiry
            assert _usage(data, "daemon:b", day) == ((0, 0.0), (tokens, cost))

            b.proc.kill()  # SIGKILL: b settles nothing
            b.proc.wait(PATIENCE)
            b = None
            # a notices (b's pid is gone) and charges the hold at its reserved amount, in one transaction
            wait_for(lambda: _usage(data, "daemon:b", day)[1] == (0, 0.0), timeout=PATIENCE,
                     what="a to charge the dead b's hold")
            used, held = _usage(data, "daemon:b", day)
            assert used == (tokens, pytest.approx(cost)) and held == (0, 0.0)
            (after,) = [h for h in _holds(data) if h[0] == hold_id]
            assert after[7] == 1  # charged (a late settle would add only the excess), not deleted
            wait_for(lambda: _rpc(a, "b", "runs.get", {"run_id": run_b})["run"]["state"] == "interrupted",
                     timeout=PATIENCE, what="a to recover b's run")
            # a's own request still reserves and settles normally on the same ledger
            fake.enqueue(Reply("fine"))
            run_a = _rpc(a, "a", "run.start", {"conversation": "ca", "prompt": "go", "mode": "ask"})["run_id"]
            wait_for(lambda: _rpc(a, "a", "runs.get", {"run_id": run_a})["run"]["state"] == "done", timeout=PATIENCE,
                     what="a's run")
            assert _usage(data, "daemon:b", day) == ((tokens, pytest.approx(cost)), (0, 0.0))  # charged once
        finally:
            for d in (a, b):
                if d is not None:
                    d.stop()
