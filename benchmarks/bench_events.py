"""The event store and the audit log (issue 2, item 6).

Figures (lower is better; targets are the issue's absolute numbers turned into ratios against this
run's baseline, like bench_gate.py does):

- batched append, µs per event, vs raw ``executemany`` of (ts, type, json) rows into a plain table
  with the same pragmas. Target: >= 100k events/s, i.e. <= 10 µs per event.
- replay of the last 10k of 1M events, SSE encoding included (``Store.replay_sse``), vs ``json.dumps``
  of the same 10k event dicts. Target: <= 10 ms.
- the same replay as ``Event`` objects (``events_since``) and SSE-encoded one by one, for comparison.
- audit append (flushed line, fsync batched), vs a bare ``os.write`` of the same line.
- 4 threads appending through one shared connection (the Store's design) vs a connection per thread.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from relay_jupyter.core.types import AuditRecord, ToolClass
from relay_jupyter.protocol.sse import encode_event
from relay_jupyter.storage import AuditLog, Store

TOTAL = 1_000_000
BATCH = 1_000
REPLAY = 10_000
ROUNDS = 5
APPEND_TARGET_US = 10.0     # 100k events/s
REPLAY_TARGET_MS = 10.0


def _items(start: int, n: int) -> list[tuple[str, dict, str | None, str | None]]:
    return [("run.text_delta", {"run_id": "r-0001", "text": f"token {i} of a streamed answer, ok"},
             "notebook:analysis.ipynb#k1", "r-0001") for i in range(start, start + n)]


def _fill(store: Store) -> float:
    """Append TOTAL events in batches; returns seconds spent inside append_events."""
    spent = 0.0
    for start in range(0, TOTAL, BATCH):
        items = _items(start, BATCH)
        t0 = time.perf_counter()
        store.append_events(items)
        spent += time.perf_counter() - t0
    return spent


def _raw_baseline(path: Path, n: int) -> float:
    """Seconds for n rows through raw executemany (json.dumps included) in batches of BATCH."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE plain (id INTEGER PRIMARY KEY, ts REAL, type TEXT, data TEXT)")
    spent = 0.0
    for start in range(0, n, BATCH):
        items = _items(start, BATCH)
        t0 = time.perf_counter()
        ts = time.time()
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO plain (ts, type, data) VALUES (?,?,?)",
                         [(ts, t, json.dumps(d)) for t, d, _, _ in items])
        conn.execute("COMMIT")
        spent += time.perf_counter() - t0
    conn.close()
    return spent


def _best(fn, rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _threads(stores: list[Store], per_thread: int) -> float:
    def worker(s: Store) -> None:
        for start in range(0, per_thread, 100):
            s.append_events(_items(start, 100))

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _audit(tmp: Path, report) -> None:
    rec = AuditRecord(ts=time.time(), origin="notebook:analysis.ipynb#k1", tool="scratch_read",
                      tool_class=ToolClass.READ, decision="allow", duration_ms=0.02, run_id="r-0001",
                      call_id="c-1", arguments={"path": "data/a.csv"})
    n = 20_000
    log = AuditLog(tmp / "audit.jsonl", max_bytes=None)
    try:
        value = _best(lambda: [log.append(rec) for _ in range(n)]) / n * 1e6
    finally:
        log.close()
    line = rec.model_copy(update={"seq": 123456}).model_dump_json().encode() + b"\n"
    fd = os.open(tmp / "raw.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        base = _best(lambda: [os.write(fd, line) for _ in range(n)]) / n * 1e6
    finally:
        os.close(fd)
    report("audit append (seq, JSON line, write; fsync batched)", value, base, "µs")


def run(report) -> None:
    """Measure append, replay, audit append and threading; see the module docstring."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        store = Store.open(tmp / "relay.db")
        try:
            spent = _fill(store)
            per_event_us = spent / TOTAL * 1e6
            base_us = _raw_baseline(tmp / "plain.db", 200_000) / 200_000 * 1e6
            print(f"[events] batched append: {TOTAL / spent:,.0f} events/s "
                  f"(raw executemany {1e6 / base_us:,.0f}/s)", file=sys.stderr)
            report(f"append, batches of {BATCH} (target >= 100k events/s)", per_event_us, base_us, "µs/event",
                   target=APPEND_TARGET_US / base_us)

            since = store.last_event_id() - REPLAY
            last, frames = store.replay_sse(since)
            assert last == store.last_event_id() and frames.count(b"\nevent: ") == REPLAY
            dicts = [e.model_dump(mode="json") for e in store.events_since(since)]
            base_ms = _best(lambda: [json.dumps(d) for d in dicts]) * 1e3
            replay_ms = _best(lambda: store.replay_sse(since)) * 1e3
            report(f"replay last {REPLAY // 1000}k of {TOTAL // 1_000_000}M as SSE (target <= 10 ms)",
                   replay_ms, base_ms, "ms", target=REPLAY_TARGET_MS / base_ms)
            objects_ms = _best(lambda: [encode_event(e) for e in store.events_since(since)]) * 1e3
            report(f"replay last {REPLAY // 1000}k as Event objects + encode_event", objects_ms, base_ms, "ms")
        finally:
            store.close()

        shared = Store.open(tmp / "threads.db")
        own = [Store.open(tmp / "threads.db") for _ in range(4)]
        try:
            per_thread = 20_000
            t_shared = min(_threads([shared] * 4, per_thread) for _ in range(2))
            t_own = min(_threads(own, per_thread) for _ in range(2))
        finally:
            shared.close()
            for s in own:
                s.close()
        report("4 threads appending: one shared connection vs a connection each", t_shared * 1e3,
               t_own * 1e3, "ms")

        _audit(tmp, report)
