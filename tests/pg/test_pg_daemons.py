"""Per-user brokers sharing PostgreSQL (issue 15 item 5): two real ``jupyter relay serve`` daemons,
alice's and bob's, each with its own data dir (audit log, workspaces, socket) and one shared
``store_url``. Their users are in one team: what alice's run spends is gone from bob's remaining
budget, and bob's run is refused once the team's day budget cannot hold his request, with the
team named in the refusal. Each user's grants, conversations, runs and leases are in their own
schema: bob's conversation "c1" is not alice's "c1"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.testing import FakeAnthropic, Reply, Usage, text

pytestmark = [pytest.mark.pg, pytest.mark.slow]

pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.storage.postgres import PostgresStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_harness import Daemon, start_daemon, wait_for  # noqa: E402

KEY = "sk-ant-test-pg-0123456789"


def _start(tmp: Path, user: str, url: str, password_file: Path, fake: FakeAnthropic, team_limit: int) -> Daemon:
    root = tmp / user
    root.mkdir()
    ensure_private_dir(root / "sock")
    cfg = root / "broker.json"
    cfg.write_text(json.dumps({
        "data_dir": str(root / "relay"), "anthropic_base_url": fake.base_url, "anthropic_api_key": KEY,
        "default_model": "claude-test-1", "store_url": url, "store_password_file": str(password_file),
        "user": user, "teams": {"ml": {"members": ["alice", "bob"], "tokens_per_day": team_limit}}}))
    return start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock", "--config", str(cfg))


def _rpc(daemon: Daemon, method: str, params: dict) -> dict:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        return conn.rpc(method, params, {"X-Relay-Client": "nb"})
    finally:
        conn.close()


def _run(daemon: Daemon, prompt: str, conversation: str = "c1") -> dict:
    reply = _rpc(daemon, "run.start", {"conversation": conversation, "prompt": prompt})
    assert "error" not in reply, reply
    run_id = reply["result"]["run_id"]
    wait_for(lambda: _rpc(daemon, "runs.get", {"run_id": run_id})["result"]["run"]["state"] != "running",
             timeout=60, what="the run to end")
    return _rpc(daemon, "runs.get", {"run_id": run_id})["result"]["run"]


def test_two_users_daemons_share_a_team_budget_on_one_database(postgres_db, tmp_path: Path) -> None:
    url, password_file = postgres_db
    for user in ("alice", "bob"):  # each daemon's client "nb": the same origin name in two users' brokers
        with PostgresStore.open(url, password_file=password_file, namespace=user) as store:
            GrantBook(store).issue(Grant(origin="daemon:nb", tools=frozenset({"*"}), models=frozenset({"*"}),
                                         consent_id="terminal",
                                         budget=Budget(requests_per_minute=None, tokens_per_day=10_000_000,
                                                       cost_per_day_usd=None)))
    with FakeAnthropic(api_key=KEY) as fake:
        # first, one run alone measures what a request reserves here (system prompt, tools, max_tokens):
        # absurd reported usage is clamped to the reservation, which is then charged to the team
        (tmp_path / "probe").mkdir()
        probe = _start(tmp_path / "probe", "alice", url, password_file, fake, 10**9)
        try:
            fake.enqueue(Reply(text("probe"), usage=Usage(input_tokens=10**8, output_tokens=5)))
            assert _run(probe, "hello", "probe")["state"] == "done"
            reserve = _rpc(probe, "budget.get", {})["result"]["usage"]["teams"][0]["day"]["tokens"]
            max_tokens = int(fake.requests[-1].body["max_tokens"])
        finally:
            probe.stop()
        with PostgresStore.open(url, password_file=password_file, namespace="alice") as store:
            with store.transaction() as conn:  # a fresh day for the team
                conn.execute("DELETE FROM relay_shared.ledger")
        assert reserve > max_tokens > 500
        # the team's day: alice's 1000 and one more request, with 500 to spare
        limit = 1000 + reserve + 500
        alice = _start(tmp_path, "alice", url, password_file, fake, limit)
        bob = _start(tmp_path, "bob", url, password_file, fake, limit)
        try:
            fake.enqueue(Reply(text("alice's answer"), usage=Usage(input_tokens=600, output_tokens=400)))
            assert _run(alice, "alice asks")["state"] == "done"
            usage = _rpc(bob, "budget.get", {})["result"]["usage"]
            [team] = usage["teams"]
            assert team["team"] == "ml" and team["day"]["tokens"] == 1000
            assert team["remaining_tokens"] == limit - 1000
            assert _rpc(alice, "budget.get", {})["result"]["usage"]["teams"][0]["remaining_tokens"] == limit - 1000
            # bob's request still fits; it spends its whole answer (max_tokens), and then his next
            # request (a longer history) no longer fits what the team has left: refused, naming the team
            fake.enqueue(Reply(text("bob's answer"), usage=Usage(input_tokens=1, output_tokens=max_tokens)))
            bob_run = _run(bob, "bob asks")
            assert bob_run["state"] == "done", bob_run
            # bob's conversation "c1" is his own: alice's prompt of her "c1" never reached his request
            assert "alice asks" not in json.dumps(fake.requests[-1].body) and "bob asks" in json.dumps(
                fake.requests[-1].body)
            refused = _run(bob, "bob asks again")
            assert refused["state"] == "budget_exhausted", refused
            with PostgresStore.open(url, password_file=password_file, namespace="bob") as store:
                [end] = [e for e in store.events_since(0) if e.run_id == refused["run_id"]
                         and e.type == "run.budget_exhausted"]
                assert end.data["team"] == "ml" and end.data["limit"] == "team_tokens_per_day"
                assert "team ml's daily token budget" in end.data["message"]
                assert len(store.leases()) == 1 and store.runs_to_recover() == []  # bob's lease, bob's runs
        finally:
            for d in (alice, bob):
                d.stop()
    for user in ("alice", "bob"):
        with PostgresStore.open(url, password_file=password_file, namespace=user) as store:
            assert store.leases() == []
