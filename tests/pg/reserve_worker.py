"""One broker process of tests/pg/test_pg_concurrency.py: its own PostgreSQL store and BudgetLedger,
``threads`` reservations at once, settled when the test says so.

    python reserve_worker.py URL PASSWORD_FILE ORIGIN TEAMS_JSON THREADS SEED

stdout ``{"ready": true}`` once connected; stdin ``go`` -> reserve (all threads released together) -> stdout ``{"ok": n, "refused": m}``;
stdin ``settle`` -> each held reservation settles a random amount up to what it held -> stdout
``{"tokens": sum, "cost_usd": sum}``.
"""

from __future__ import annotations

import json
import random
import sys
import threading

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.errors import GateRefusal
from relay_jupyter.core.teams import Teams, user_of_origin
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage.postgres import PostgresStore

RESERVE_TOKENS = 100
RESERVE_COST = 0.01
DAY_LIMIT = 2000  # the notebook's own limit in the no-team scenario: 20 of the reservations fit


def main() -> None:
    url, password_file, origin, teams_json, threads, seed = sys.argv[1:7]
    teams = Teams.from_config(json.loads(teams_json))
    n = int(threads)
    store = PostgresStore.open(url, password_file=password_file, max_size=n)
    ledger = BudgetLedger(store, teams_for=lambda o: teams.of_user(user_of_origin(o, None)),
                          transaction=store.transaction)
    limit = None if teams else DAY_LIMIT
    grant = Grant(origin=origin, consent_id="c", budget=Budget(requests_per_minute=None, tokens_per_day=limit,
                                                               cost_per_day_usd=None))
    rng = random.Random(int(seed))
    start = threading.Barrier(n)
    held: list = []
    refused: list = []
    lock = threading.Lock()

    def reserve() -> None:
        start.wait()
        try:
            r = ledger.reserve(origin, grant, tokens=RESERVE_TOKENS, cost_usd=RESERVE_COST)
        except GateRefusal as exc:
            with lock:
                refused.append(exc.data.get("limit"))
        else:
            with lock:
                held.append(r)

    print(json.dumps({"ready": True}), flush=True)
    assert sys.stdin.readline().strip() == "go"
    workers = [threading.Thread(target=reserve) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"ok": len(held), "refused": len(refused), "limits": sorted(set(map(str, refused)))}),
          flush=True)
    assert sys.stdin.readline().strip() == "settle"
    tokens, cost = 0, 0.0
    for r in held:
        t = rng.randint(1, RESERVE_TOKENS)
        c = round(rng.uniform(0, RESERVE_COST), 6)
        r.settle(t, c)
        tokens += t
        cost += c
    print(json.dumps({"tokens": tokens, "cost_usd": cost}), flush=True)
    store.close()


if __name__ == "__main__":
    main()
