"""AuditLog.tail for an origin (issue 18): a byte pre-filter before any parse, never under the append
lock, exact origin match, across rotated files."""

from __future__ import annotations

import threading
from pathlib import Path

from relay_jupyter.core.types import AuditRecord, ToolClass
from relay_jupyter.storage.audit_log import AuditLog


def rec(i: int, who: str, **args: object) -> AuditRecord:
    return AuditRecord(ts=float(i), origin=who, tool="srv__t", tool_class=ToolClass.WRITE, decision="allow",
                       arguments=dict(args))


WEIRD = 'notebook:dir/"q" é\\x\t😀.ipynb'


def test_tail_of_an_origin_matches_exactly_across_rotations(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=4096, keep=3)
    try:
        for i in range(120):
            origin = WEIRD if i % 10 == 0 else ("notebook:a.ipynb" if i % 2 else "notebook:b.ipynb")
            # the other origins' records carry WEIRD's exact bytes ("origin":"...") in their arguments:
            # the byte pre-filter lets them through, the parsed origin must not
            log.append(rec(i, origin, origin=WEIRD, path=WEIRD))
        assert len(list(tmp_path.glob("audit.jsonl.[0-9]"))) == 3
        got = log.tail(100, origin=WEIRD)
        # the oldest records were rotated away (keep=3): what is left of WEIRD's, oldest first
        assert got and all(r.origin == WEIRD for r in got)
        assert [r.ts for r in got] == sorted(r.ts for r in got)
        assert [int(r.ts) % 10 for r in got] == [0] * len(got)
        everything = log.tail(1000)
        assert [r for r in everything if r.origin == WEIRD] == got
        assert log.tail(2, origin=WEIRD) == got[-2:]
        assert log.tail(5, origin="notebook:nobody.ipynb") == []
    finally:
        log.close()


def test_tail_does_not_wait_for_the_append_lock(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    try:
        for i in range(5):
            log.append(rec(i, "notebook:a.ipynb"))
        out: list[list[AuditRecord]] = []
        log._lock.acquire()  # an append in progress (the lock every gate decision takes)
        try:
            reader = threading.Thread(target=lambda: out.append(log.tail(3, origin="notebook:a.ipynb")))
            reader.start()
            reader.join(30)
            assert not reader.is_alive(), "tail waited for the append lock"
        finally:
            log._lock.release()
        assert [int(r.ts) for r in out[0]] == [2, 3, 4]
    finally:
        log.close()


def test_a_line_longer_than_a_scan_block(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=None)
    try:
        log.append(rec(0, "notebook:a.ipynb"))
        log.append(rec(1, "notebook:b.ipynb", blob="x" * (3 << 20)))  # spans several 1 MiB blocks
        log.append(rec(2, "notebook:a.ipynb"))
        assert [int(r.ts) for r in log.tail(10, origin="notebook:b.ipynb")] == [1]
        assert [int(r.ts) for r in log.tail(10, origin="notebook:a.ipynb")] == [0, 2]
        assert [int(r.ts) for r in log.tail(10)] == [0, 1, 2]
    finally:
        log.close()
