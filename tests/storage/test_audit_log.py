"""Audit log: seq, torn tails, rotation with continuous seq, one writer, batched fsync."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from unittest import mock

import pytest

from relay_jupyter.core.ports import AuditSink
from relay_jupyter.core.types import AuditRecord, ToolClass
from relay_jupyter.storage import AuditLog, StoreError
from relay_jupyter.storage.audit_log import read_audit_file
from relay_jupyter.storage.errors import StorageUnavailable


def rec(i: int = 0, origin: str = "o", **kw) -> AuditRecord:
    return AuditRecord(ts=float(i), origin=origin, tool="srv__t", tool_class=ToolClass.WRITE, decision="deny",
                       code="CONSENT_DENIED", arguments={"i": i}, **kw)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


def seqs(path: Path) -> list[int]:
    return [r["seq"] for r in read_audit_file(path)]


def test_append_assigns_seq_and_round_trips(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        assert isinstance(log, AuditSink)
        stored = [log.append(rec(i)) for i in range(3)]
        assert [r.seq for r in stored] == [1, 2, 3]
        assert stored[1] == rec(1).model_copy(update={"seq": 2})
        assert log.tail() == stored
        assert log.last_seq == 3
    assert stat.S_IMODE(os.stat(log_path).st_mode) == 0o600
    lines = log_path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4  # one record per line, newline-terminated


def test_tail_limits_and_origin(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        for i in range(10):
            log.append(rec(i, origin="a" if i % 3 == 0 else "b"))
        assert [r.seq for r in log.tail(4)] == [7, 8, 9, 10]
        assert [r.seq for r in log.tail(100, origin="a")] == [1, 4, 7, 10]
        assert [r.seq for r in log.tail(2, origin="a")] == [7, 10]
        assert log.tail(0) == [] and log.tail(-1) == []
        assert log.tail(5, origin="nobody") == []


def test_seq_continues_after_reopen(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        log.append(rec())
        log.append(rec())
    with AuditLog(log_path) as log:
        assert log.append(rec()).seq == 3
    assert seqs(log_path) == [1, 2, 3]


@pytest.mark.parametrize("torn", [
    b'{"seq":3,"ts":1.0,"ori',            # no newline: a write cut short
    b"\x00\x00\x00\x00",                   # zeros a power loss can leave
    b'{"seq":3,"ts":1.0,"ori\n',           # garbage line with a newline
    b'not json\n{"seq": 3',                # several bad lines at the end
    b'[1,2]\n',                            # valid JSON but not a record
    b'{"seq": "3"}\n',                     # seq not an integer
])
def test_torn_tail_dropped_on_open(log_path: Path, torn: bytes) -> None:
    with AuditLog(log_path) as log:
        log.append(rec())
        log.append(rec())
    good = log_path.read_bytes()
    with open(log_path, "ab") as fh:
        fh.write(torn)
    with AuditLog(log_path) as log:
        assert log_path.read_bytes() == good
        assert [r.seq for r in log.tail()] == [1, 2]
        assert log.append(rec()).seq == 3
    assert seqs(log_path) == [1, 2, 3]
    assert log_path.read_bytes().endswith(b"\n")


def test_all_garbage_file_starts_over(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(b"garbage without newline" * 10_000)  # spans several read blocks
    with AuditLog(log_path) as log:
        assert log_path.read_bytes() == b""
        assert log.append(rec()).seq == 1


def test_long_records_across_read_blocks(log_path: Path) -> None:
    big = "x" * 200_000
    with AuditLog(log_path) as log:
        log.append(rec(1))
        log.append(rec(2).model_copy(update={"arguments": {"s": big}}))
        log.append(rec(3))
    with open(log_path, "ab") as fh:
        fh.write(b'{"seq":4,' + b"y" * 150_000)
    with AuditLog(log_path) as log:
        assert [r.seq for r in log.tail()] == [1, 2, 3]
        assert log.tail(2)[0].arguments == {"s": big}


def test_rotation_keeps_seq_continuous(log_path: Path) -> None:
    line_len = len(rec(0).model_copy(update={"seq": 10}).model_dump_json()) + 1
    with AuditLog(log_path, max_bytes=line_len * 3, keep=2) as log:
        for i in range(10):
            log.append(rec(i))
        assert [r.seq for r in log.tail(7)] == [4, 5, 6, 7, 8, 9, 10]
    live, r1, r2 = log_path, log_path.with_name("audit.jsonl.1"), log_path.with_name("audit.jsonl.2")
    assert (seqs(r2), seqs(r1), seqs(live)) == ([4, 5, 6], [7, 8, 9], [10])  # 1-3 rotated out
    assert not log_path.with_name("audit.jsonl.3").exists()
    for p in (live, r1, r2):
        assert os.path.getsize(p) <= line_len * 3
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    with AuditLog(log_path, max_bytes=line_len * 3, keep=2) as log:
        assert log.append(rec()).seq == 11


def test_seq_continues_from_rotated_file_when_live_file_is_empty(log_path: Path) -> None:
    with AuditLog(log_path, keep=3) as log:
        for _ in range(4):
            log.append(rec())
    os.replace(log_path, log_path.with_name("audit.jsonl.1"))  # as right after a rotation
    log_path.touch()
    with AuditLog(log_path, keep=3) as log:
        assert log.append(rec()).seq == 5
        assert [r.seq for r in log.tail(3)] == [3, 4, 5]


def test_no_rotation_when_keep_is_zero(log_path: Path) -> None:
    with AuditLog(log_path, max_bytes=400, keep=0) as log:
        for _ in range(10):
            log.append(rec())
        assert log.tail(100)[-1].seq == 10
    # keep=0: the full file is dropped, nothing rotated is kept
    assert sorted(p.name for p in log_path.parent.iterdir()) == ["audit.jsonl", "audit.jsonl.lock"]
    assert seqs(log_path)[-1] == 10


def test_two_writers_share_one_log(log_path: Path) -> None:
    """Two brokers on one data directory (issue 12): both append to the same file, seq stays unique
    and increasing across them, rotation by either one is followed by the other."""
    with AuditLog(log_path, max_bytes=600, keep=50) as a, AuditLog(log_path, max_bytes=600, keep=50) as b:
        got = [(a if n % 3 else b).append(rec()).seq for n in range(40)]
        assert got == list(range(1, 41))
        assert a.tail(5)[-1].seq == b.tail(5)[-1].seq == 40
    files = [log_path.with_name(f"audit.jsonl.{i}") for i in range(50, 0, -1)] + [log_path]
    all_seqs = [s for f in files if f.exists() for s in seqs(f)]
    assert all_seqs == list(range(1, 41))
    with AuditLog(log_path) as log:  # a later writer continues after both
        assert log.append(rec()).seq == 41


def test_second_writer_drops_a_torn_tail_before_appending(log_path: Path) -> None:
    with AuditLog(log_path) as a, AuditLog(log_path) as b:
        a.append(rec())
        with open(log_path, "ab") as fh:  # what a writer killed in the middle of a short write leaves
            fh.write(b'{"seq": 2, "ts"')
        assert b.append(rec()).seq == 2
        assert a.append(rec()).seq == 3
    assert seqs(log_path) == [1, 2, 3]


def test_closed_log_refuses_append(log_path: Path) -> None:
    log = AuditLog(log_path)
    log.close()
    log.close()
    with pytest.raises(StoreError, match="closed"):
        log.append(rec())
    log.sync()  # harmless after close


@pytest.mark.parametrize("kw", [{"max_bytes": 0}, {"keep": -1}, {"fsync_every": 0}, {"fsync_interval": 0}])
def test_bad_settings_refused(log_path: Path, kw: dict) -> None:
    with pytest.raises(ValueError):
        AuditLog(log_path, **kw)


def test_concurrent_appends_give_unique_ordered_seq(log_path: Path) -> None:
    with AuditLog(log_path, max_bytes=20_000, keep=50) as log:
        def worker() -> None:
            for i in range(200):
                log.append(rec(i))

        threads = [threading.Thread(target=worker) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [r.seq for r in log.tail(10_000)]
    assert got == list(range(1, 1001))


def test_fsyncs_are_batched(log_path: Path) -> None:
    """Appends do not fsync inline; the background thread does, once per batch, and close() does."""
    real_fsync = os.fsync
    calls: list[int] = []

    def counting(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    log = AuditLog(log_path, fsync_every=50, fsync_interval=30.0)
    with mock.patch("relay_jupyter.storage.audit_log.os.fsync", side_effect=counting):
        for _ in range(49):
            log.append(rec())
        assert calls == []  # below fsync_every and long before fsync_interval
        log.append(rec())   # the 50th wakes the fsync thread
        for _ in range(200):
            if calls:
                break
            threading.Event().wait(0.01)
        assert len(calls) == 1
        log.sync()
        assert len(calls) == 2
        log.close()
        assert len(calls) == 3


def test_interval_fsync_happens_without_more_appends(log_path: Path) -> None:
    real_fsync = os.fsync
    synced = threading.Event()

    def counting(fd: int) -> None:
        real_fsync(fd)
        synced.set()

    with (mock.patch("relay_jupyter.storage.audit_log.os.fsync", side_effect=counting),
          AuditLog(log_path, fsync_every=1000, fsync_interval=0.02) as log):
        log.append(rec())
        assert synced.wait(5.0)


def test_failed_write_leaves_no_torn_line(log_path: Path) -> None:
    """A disk that refuses mid-line (ENOSPC) must not leave half a record in the log."""
    real_write = os.write
    state = {"n": 0}

    def short_then_fail(fd: int, data) -> int:
        state["n"] += 1
        if state["n"] == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    with AuditLog(log_path) as log:
        log.append(rec())
        with (mock.patch("relay_jupyter.storage.audit_log.os.write", side_effect=short_then_fail),
              pytest.raises(StorageUnavailable) as refused):
            log.append(rec())
        # a Refusal with the code a client sees (the gate then runs nothing it could not audit)
        assert refused.value.code.value == "STORAGE_FULL" and "free some space" in refused.value.message
        assert log.append(rec()).seq == 2
    assert seqs(log_path) == [1, 2]
    assert len(log_path.read_bytes().split(b"\n")) == 3


def test_with_seq_equals_model_copy() -> None:
    """The fast copy in append() must be indistinguishable from pydantic's model_copy."""
    from relay_jupyter.storage.audit_log import _with_seq

    original = rec(3, run_id="r", answered_by="client-1")
    fast, slow = _with_seq(original, 42), original.model_copy(update={"seq": 42})
    assert fast == slow
    assert fast.model_dump() == slow.model_dump() and fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert type(fast) is AuditRecord and original.seq == 0
    with pytest.raises(ValueError):  # still frozen
        fast.seq = 1  # type: ignore[misc]
    assert AuditRecord.model_validate_json(fast.model_dump_json()) == fast


def test_unopenable_path_gives_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match="cannot open the audit log"):
        AuditLog(tmp_path / "afile" / "audit.jsonl")
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreError, match="cannot open the audit log"):
        AuditLog(tmp_path / "adir")
    with AuditLog(tmp_path / "ok.jsonl") as log:  # nothing was left locked or open
        log.append(rec())
