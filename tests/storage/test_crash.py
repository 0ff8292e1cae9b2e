"""Crash test: SIGKILL a writer mid-append; nothing it reported as committed is lost, nothing torn is visible."""

from __future__ import annotations

import json
import os
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from relay_jupyter.storage import AuditLog, Store
from relay_jupyter.storage.audit_log import read_audit_file

# The child reports an id / seq only AFTER append_events committed / the audit line was written.
CHILD = r"""
import sys
from relay_jupyter.core.types import AuditRecord
from relay_jupyter.storage import AuditLog, Store

store = Store.open(sys.argv[1])
audit = AuditLog(sys.argv[2], max_bytes=int(sys.argv[3]), keep=1000)
print("ready", flush=True)
i = 0
while True:
    batch = [("crash.test", {"i": i, "k": k, "pad": "x" * 300}, None, "r") for k in range(50)]
    events = store.append_events(batch)
    print(f"E {events[-1].id}", flush=True)
    record = audit.append(AuditRecord(ts=float(i), origin="o", tool="t", decision="allow",
                                      arguments={"i": i, "pad": "y" * 300}))
    print(f"A {record.seq}", flush=True)
    i += 1
"""


class Lines:
    """Complete lines from the child's stdout, read with a deadline; extra lines wait for the next call."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.buf = b""

    def take(self, count: int, deadline: float) -> list[str]:
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while len(self.lines) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"child gave {len(self.lines)} of {count} lines")
                if not sel.select(remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"child exited early: {self.proc.stderr.read()!r}")
                *done, self.buf = (self.buf + chunk).split(b"\n")
                self.lines.extend(x.decode() for x in done)
        out, self.lines = self.lines[:count], self.lines[count:]
        return out

    def kill_and_drain(self) -> list[str]:
        """SIGKILL the child, then every complete line it printed before it died."""
        os.kill(self.proc.pid, signal.SIGKILL)
        out, _ = self.proc.communicate(timeout=30)
        assert self.proc.returncode == -signal.SIGKILL
        # a last piece without its newline is not a report
        rest = (self.buf + out).split(b"\n")[:-1]
        return self.lines + [x.decode() for x in rest]


KILL_AFTER = [1, 9, 60, 240]
"""Report lines to read before each kill: four rounds on the same files, each resuming the last."""


def test_sigkill_mid_append_loses_nothing_committed(tmp_path: Path) -> None:
    db, log = tmp_path / "relay.db", tmp_path / "audit.jsonl"
    reported_events: list[int] = []
    reported_seqs: list[int] = []
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for round_, lines_before_kill in enumerate(KILL_AFTER):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(log), str(64 * 1024)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        reader = Lines(proc)
        try:
            deadline = time.monotonic() + 60
            assert reader.take(1, deadline) == ["ready"]
            lines = reader.take(lines_before_kill, deadline)
        finally:
            lines_after = reader.kill_and_drain()
        for line in lines + lines_after:
            kind, _, value = line.partition(" ")
            (reported_events if kind == "E" else reported_seqs).append(int(value))
        assert reported_events, "the child committed nothing before the kill"

        if round_ % 2 == 1:
            # what a power loss could add on top: a half-written line at the end of the live file
            with open(log, "ab") as fh:
                fh.write(b'{"seq":999999,"ts":1.0,"origin":"o","tool":"t","deci')

        # the store: every reported id is there, ids contiguous, the file intact
        with Store.open(db) as store:
            with store.snapshot() as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            ids = [e.id for e in store.events_since(0)]
            assert ids == list(range(1, len(ids) + 1))
            assert max(reported_events) <= ids[-1]
            assert set(reported_events) <= set(ids)
            # whole batches only: a batch of 50 commits or vanishes entirely
            assert len(ids) % 50 == 0
            last_frame_id, frames = store.replay_sse(ids[-1] - 1)
            assert last_frame_id == ids[-1] and frames.endswith(b"\n\n")

        # the audit log: reopen drops any torn tail; every reported seq is there, seqs contiguous
        with AuditLog(log, max_bytes=64 * 1024, keep=1000) as audit:
            files = sorted(tmp_path.glob("audit.jsonl*"), key=lambda p: (p.name.count("."), p.name))
            for path in [p for p in files if not p.name.endswith(".lock")]:
                raw = path.read_bytes()
                assert raw == b"" or raw.endswith(b"\n"), path
                for line in raw.split(b"\n")[:-1]:
                    assert isinstance(json.loads(line)["seq"], int)
            got = [r.seq for r in audit.tail(1_000_000)]
            assert got == list(range(1, len(got) + 1))
            assert set(reported_seqs) <= set(got)
            assert 999999 not in got
            assert audit.last_seq == len(got)
            live = [r["seq"] for r in read_audit_file(log)]
            assert live == got[len(got) - len(live):]

    # the database was opened and written by 5 processes in turn; a final plain reader agrees
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] % 50 == 0
    finally:
        conn.close()
