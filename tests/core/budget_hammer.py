"""One process of ``test_budgets.py::test_processes_sharing_a_store_never_overspend``: reserve and settle against a
day limit on a shared SQLite store, in a plain interpreter.

``python budget_hammer.py PATH N EST USED LIMIT GO``: opens the store at PATH, prints ``ready``, waits for the file GO,
then reserves EST tokens and settles USED, N times, and prints the JSON list of what it settled.

A script rather than a ``multiprocessing`` spawn pool: a spawned worker re-imports pytest and the whole test module
(hypothesis, ...), twice the start-up of this script (0.85 s against 0.4 s of CPU each, 16 of them on 2 cores).
"""

from __future__ import annotations

import json
import os
import sys
import time

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.errors import GateRefusal
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.storage.sqlite import Store


def hammer(path: str, n: int, est: int, used: int, limit: int, go: str) -> list[int]:
    led = BudgetLedger(Store.open(path))
    g = Grant(origin="nb", tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c",
              budget=Budget(requests_per_minute=None, tokens_per_day=limit))
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    settled = []
    for _ in range(n):
        try:
            r = led.reserve("nb", g, tokens=est, cost_usd=0.0)
        except GateRefusal:
            continue
        time.sleep(0.001)  # in flight while the others reserve
        r.settle(used, 0.0)
        settled.append(used)
    return settled


if __name__ == "__main__":
    path, n, est, used, limit, go = sys.argv[1:]
    print(json.dumps(hammer(path, int(n), int(est), int(used), int(limit), go)), flush=True)
