"""A broker process that takes a lease and one budget hold, then waits to be killed: the other process
of the store contract's "a SIGKILLed broker's holds are charged at once" (store_contract.py).

    python -m relay_jupyter.testing.hold_worker sqlite PATH KEY DAY TOKENS COST
    python -m relay_jupyter.testing.hold_worker pg URL PASSWORD_FILE NAMESPACE KEY DAY TOKENS COST

Writes ``{"hold": "<hold id>", "owner": "<owner id>"}`` to stdout once the hold is committed, then
blocks reading stdin (the test SIGKILLs it: nothing is settled, released or cleaned up). The hold
never expires (``expires_at`` far in the future), so only its dead owner can get it charged.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

NEVER = 1e12
"""``expires_at`` of the hold: its expiry cannot be what charges it."""


def _open(argv: list[str]) -> tuple[Any, list[str]]:
    kind = argv[0]
    if kind == "sqlite":
        from ..storage.sqlite import Store

        return Store.open(argv[1]), argv[2:]
    if kind == "pg":
        from ..storage.postgres import PostgresStore

        return PostgresStore.open(argv[1], password_file=argv[2], namespace=argv[3] or None), argv[4:]
    raise SystemExit(f"hold_worker: unknown store kind {kind!r}")


def main(argv: list[str]) -> None:
    store, rest = _open(argv)
    key, day, tokens, cost = rest[0], rest[1], int(rest[2]), float(rest[3])
    owner = store.acquire_lease()
    hold = store.hold(key, day, tokens, cost, now=time.time(), expires_at=NEVER, check=lambda *a: None)
    print(json.dumps({"hold": hold, "owner": owner}), flush=True)
    sys.stdin.read()  # until killed (or stdin closes: then it exits without settling, as a crash would)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
