"""50 concurrent reservations from five broker processes (each its own PostgreSQL store and pool,
ten threads each, released together) never overspend a day limit, and afterwards the ledger equals
the sum of what was settled: for one notebook's own limit, and for a team budget two users' notebooks
draw from (alice's spend is bob's too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.budgets import utc_day
from relay_jupyter.core.teams import team_key

pytestmark = [pytest.mark.pg, pytest.mark.slow]

pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.storage.postgres import PostgresStore  # noqa: E402

WORKER = Path(__file__).with_name("reserve_worker.py")
PROCESSES, THREADS = 5, 10
FITS = 20  # 2000 tokens of limit / 100 tokens per reservation


def _run(url: str, password_file: Path, origins: list[str], teams: dict) -> tuple[list[dict], list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, str(password_file), origin, json.dumps(teams),
                               str(THREADS), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env) for n, origin in enumerate(origins)]
    try:
        for p in procs:  # every process is connected and waiting before any reserves
            assert json.loads(p.stdout.readline()) == {"ready": True}  # type: ignore[union-attr]
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        reserved = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        for p in procs:
            p.stdin.write("settle\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        settled = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return reserved, settled


def test_fifty_reservations_from_five_processes_never_overspend_a_notebook(postgres_db) -> None:
    url, password_file = postgres_db
    origin = "notebook:shared.ipynb"
    reserved, settled = _run(url, password_file, [origin] * PROCESSES, {})
    # every hold was alive while the others reserved: exactly what fits got through, the rest refused
    assert sum(r["ok"] for r in reserved) == FITS
    assert sum(r["refused"] for r in reserved) == PROCESSES * THREADS - FITS
    assert {lim for r in reserved for lim in r["limits"]} <= {"tokens_per_day"}
    store = PostgresStore.open(url, password_file=password_file)
    try:
        day = utc_day(store.now())
        tokens, cost = store.usage(origin, day)
        assert tokens == sum(s["tokens"] for s in settled) <= 2000
        assert cost == pytest.approx(sum(s["cost_usd"] for s in settled))
        assert store.held(origin, day) == (0, 0.0)
    finally:
        store.close()


def test_a_team_budget_shared_by_two_users_is_never_overspent(postgres_db) -> None:
    url, password_file = postgres_db
    alice, bob = "user:alice/notebook:a.ipynb", "user:bob/notebook:b.ipynb"
    teams = {"ml": {"members": ["alice", "bob"], "tokens_per_day": 2000, "tokens_per_month": 100_000}}
    origins = [alice, bob, alice, bob, alice]
    reserved, settled = _run(url, password_file, origins, teams)
    assert sum(r["ok"] for r in reserved) == FITS
    assert {lim for r in reserved for lim in r["limits"]} == {"team_tokens_per_day"}
    store = PostgresStore.open(url, password_file=password_file)
    try:
        day = utc_day(store.now())
        total = sum(s["tokens"] for s in settled)
        team_day, team_cost = store.usage(team_key("ml"), day)
        assert team_day == total <= 2000
        assert store.usage(team_key("ml"), day[:7])[0] == total
        assert store.usage(alice, day)[0] + store.usage(bob, day)[0] == total
        assert team_cost == pytest.approx(sum(s["cost_usd"] for s in settled))
        assert store.held(team_key("ml"), day) == (0, 0.0) and store.held(team_key("ml"), day[:7]) == (0, 0.0)
    finally:
        store.close()
