"""The audit log: JSON lines, one :class:`~relay_jupyter.core.types.AuditRecord` per line, ``seq`` from 1.

- **Append** assigns the next ``seq`` and writes the whole line with one ``write(2)`` on an
  ``O_APPEND`` descriptor: once ``append`` returns, the line is in the kernel and survives a crash of
  this process. ``fsync`` (about 130 µs here) is batched by a background thread: after
  ``fsync_every`` records or ``fsync_interval`` seconds, whichever comes first, and on :meth:`sync`
  and :meth:`close`. That keeps an append at a few microseconds (benchmarks/bench_events.py).
- **Open** drops a torn tail: bytes after the last newline, and complete lines at the end that are not
  a JSON object with an integer ``seq`` (what a power loss can leave), are truncated away; ``seq``
  continues from the last good record (looking into rotated files when the live one is empty).
- **Rotation** by size: when a line would take the live file past ``max_bytes`` it becomes
  ``<name>.1`` (``.1`` → ``.2`` …, ``keep`` rotated files are kept); ``seq`` continues across files.
- Several writers (issue 12: two brokers on one data directory): each append holds an exclusive
  ``flock`` on ``<name>.lock`` for its one write. Under that lock a writer first checks whether the
  file changed since its own last write (another writer appended, or rotated it: a new inode) and
  then continues from the file's last ``seq``, so ``seq`` stays unique and increasing across writers.
  A torn tail another writer's crash left is truncated under the lock before the next line.

Arguments must be redacted before they get here (``core.redact``); this module stores what it is given.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Self

from pydantic_core import to_json

from ..core.types import AuditRecord
from .errors import StoreError, storage_failure

__all__ = ["AuditLog", "read_audit_file"]

_BLOCK = 1 << 16


def _reverse_lines(fh: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(start, line)`` for each complete line in ``fh[:end]``, newest first.

    ``end`` must be 0 or just past a newline; ``line`` excludes its newline.
    """
    buf, pos = b"", end
    while True:
        if buf:
            i = buf.rfind(b"\n", 0, len(buf) - 1)
            if i >= 0 or pos == 0:
                start = i + 1
                yield pos + start, buf[start:-1]
                buf = buf[:start]
                continue
        if pos == 0:
            return
        step = min(_BLOCK, pos)
        pos -= step
        fh.seek(pos)
        buf = fh.read(step) + buf


def _last_newline_end(fh: BinaryIO, size: int) -> int:
    """Offset just past the last newline in ``fh[:size]`` (0 when there is none)."""
    pos = size
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        fh.seek(pos)
        i = fh.read(step).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def _seq_of(line: bytes) -> int | None:
    """The ``seq`` of a well-formed record line, else None."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    seq = obj.get("seq") if isinstance(obj, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None


def _last_good(path: Path) -> tuple[int, int]:
    """``(good_end, last_seq)`` of ``path``: where the intact prefix ends and its last ``seq`` (0: none)."""
    try:
        with open(path, "rb") as fh:
            end = _last_newline_end(fh, os.fstat(fh.fileno()).st_size)
            for start, line in _reverse_lines(fh, end):
                seq = _seq_of(line)
                if seq is not None:
                    return start + len(line) + 1, seq
    except FileNotFoundError:
        pass
    return 0, 0


def _with_seq(record: AuditRecord, seq: int) -> AuditRecord:
    """``record`` with its ``seq``: pydantic's public ``model_copy`` (issue 14 item 7: the hand-built
    copy that wrote pydantic's private attributes saved about a microsecond per decision, which no
    user can see)."""
    return record.model_copy(update={"seq": seq})


class AuditLog:
    """``AuditSink`` writing JSON lines to ``path`` (mode 0600). Thread-safe; other ``AuditLog``
    objects (in this process or others) may write the same file at the same time."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int | None = 16 << 20, keep: int = 5,
                 fsync_every: int = 256, fsync_interval: float = 0.05) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive or None")
        if keep < 0 or fsync_every < 1 or fsync_interval <= 0:
            raise ValueError("keep must be >= 0, fsync_every >= 1 and fsync_interval > 0")
        self.path = Path(path)
        self.max_bytes, self.keep = max_bytes, keep
        self._every, self._interval = fsync_every, fsync_interval
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._sibling(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the audit log {self.path}: {exc.strerror or exc}") from exc
        self._fd = -1
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._seq = self._repair()
                self._fd = self._open_live()
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        except BaseException as exc:
            os.close(self._lock_fd)
            if isinstance(exc, OSError):
                raise StoreError(f"cannot open the audit log {self.path}: {exc.strerror or exc}") from exc
            raise
        self._size = os.fstat(self._fd).st_size
        # append() takes the plain lock (its C context manager is cheaper than Condition's Python
        # __enter__/__exit__, a tenth of an append); the fsync thread waits on a Condition of that lock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._dirty = False
        self._pending = 0
        self._closed = False
        self._thread = threading.Thread(target=self._sync_loop, name="relay-audit-fsync", daemon=True)
        self._thread.start()

    # -- files ----------------------------------------------------------------------------------

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _rotated(self) -> list[Path]:
        """Rotated files, newest first."""
        return [self._sibling(f".{i}") for i in range(1, self.keep + 1)]

    def _open_live(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        return fd

    def _repair(self) -> int:
        """Truncate a torn tail of the live file; return the last ``seq`` written anywhere."""
        good_end, seq = _last_good(self.path)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size != good_end:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, good_end)
                os.fsync(fd)
            finally:
                os.close(fd)
        if seq == 0:
            for old in self._rotated():
                seq = _last_good(old)[1]
                if seq:
                    break
        return seq

    def _rotate_locked(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        rotated = self._rotated()
        if rotated:
            for older, newer in zip(reversed(rotated[1:]), reversed(rotated[:-1]), strict=True):
                if newer.exists():
                    os.replace(newer, older)
            os.replace(self.path, rotated[0])
        else:
            os.unlink(self.path)
        self._fd = self._open_live()
        self._size = 0
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- writing --------------------------------------------------------------------------------

    def append(self, record: AuditRecord) -> AuditRecord:
        """Write ``record`` with the next ``seq`` (flushed to the OS, fsync batched); return the stored copy.

        Raises StoreError after :meth:`close`, StorageUnavailable (STORAGE_FULL / STORAGE_ERROR) when
        the disk refuses the write (nothing is left half-written then).
        """
        with self._lock:
            if self._closed:
                raise StoreError("the audit log is closed")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._follow_locked()
                stored = _with_seq(record, self._seq + 1)
                line = stored.__pydantic_serializer__.to_json(stored) + b"\n"
                if self.max_bytes is not None and self._size and self._size + len(line) > self.max_bytes:
                    self._rotate_locked()
                self._write_locked(line)
            except OSError as exc:  # a full disk: the caller (the gate) must not run what it could not audit
                raise storage_failure(exc, str(self.path)) from exc
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._seq += 1
            self._pending += 1
            if not self._dirty or self._pending == self._every:
                self._dirty = True
                self._cond.notify()
            return stored

    def _follow_locked(self) -> None:
        """Catch up with other writers (the file lock is held): reopen a file they rotated away and
        continue from the newest ``seq`` when they appended since our last write."""
        mine = os.fstat(self._fd)
        try:
            live = os.stat(self.path)
        except FileNotFoundError:
            live = None
        if live is None or (live.st_ino, live.st_dev) != (mine.st_ino, mine.st_dev):
            os.close(self._fd)
            self._fd = -1
            self._fd = self._open_live()
            mine = os.fstat(self._fd)
            self._size = -1  # force the re-read below
        if mine.st_size != self._size:
            self._seq = max(self._seq, self._repair())
            self._size = os.fstat(self._fd).st_size

    def _write_locked(self, line: bytes) -> None:
        written = 0
        try:
            written = os.write(self._fd, line)
            if written < len(line):  # a short write (a full disk, a signal): write the rest
                view = memoryview(line)
                while written < len(line):
                    written += os.write(self._fd, view[written:])
        except BaseException:
            if written:
                # never leave a torn line in the middle of the log
                os.ftruncate(self._fd, self._size)
            raise
        self._size += written

    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if not self._closed and self._pending < self._every:
                    self._cond.wait_for(lambda: self._closed or self._pending >= self._every, self._interval)
                if self._closed:
                    return  # close() does the last fsync
                fd, self._dirty, self._pending = self._fd, False, 0
            try:
                os.fsync(fd)
            except OSError:
                pass  # rotated and closed meanwhile; rotation fsynced that file itself

    def sync(self) -> None:
        """fsync now: every record appended so far is on disk when this returns."""
        with self._cond:
            if self._closed:
                return
            os.fsync(self._fd)
            self._dirty, self._pending = False, 0

    def close(self) -> None:
        """Stop the fsync thread, fsync and close the file, release the writer lock. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            os.close(self._lock_fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """``seq`` of the newest record (0 when none)."""
        with self._cond:
            return self._seq

    def tail(self, n: int = 100, *, origin: str | None = None,
             where: Callable[[AuditRecord], bool] | None = None) -> list[AuditRecord]:
        """The last ``n`` records (oldest first), optionally only those of ``origin`` and those ``where`` keeps
        (applied while reading, so the ``n`` are the newest matching ones however many others are newer).

        Reads backwards through the live file and then the rotated ones, **without the append
        lock** (appends go on meanwhile; a record is one ``write(2)`` of a whole line, so a reader
        never sees half of one). For an origin, blocks and lines that do not contain its JSON
        bytes are skipped before anything is parsed, so asking for an origin with no records in
        a big log costs a byte scan, not a parse per line (issue 18). Lines that do not parse as a
        record (e.g. from an older format) are skipped; a record met twice (a rotation during the
        read) is returned once.
        """
        if n <= 0:
            return []
        needle = None if origin is None else b'"origin":' + to_json(origin)
        found: list[AuditRecord] = []
        seen: set[int] = set()
        for path in (self.path, *self._rotated()):
            for line in _lines_reverse(path, needle):
                try:
                    record = AuditRecord.model_validate_json(line)
                except ValueError:
                    continue
                if (origin is not None and record.origin != origin) or record.seq in seen:
                    continue
                if where is not None and not where(record):
                    continue
                seen.add(record.seq)
                found.append(record)
                if len(found) == n:
                    return found[::-1]
        return found[::-1]


_SCAN_BLOCK = 1 << 20


def _lines_reverse(path: Path, needle: bytes | None) -> Iterator[bytes]:
    """The complete lines of ``path``, newest first; with ``needle``, only lines containing it, and
    a block without it is skipped whole (no line splitting). A missing file yields nothing."""
    try:
        # not a with-statement around the open: a missing rotated file ends the generator quietly,
        # while the body's own errors must not be mistaken for that
        fh = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        pos = _last_newline_end(fh, os.fstat(fh.fileno()).st_size)
        carry = b""  # the start of a line whose rest was read in the previous (later) block
        while pos > 0:
            step = min(_SCAN_BLOCK, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step) + carry
            if pos > 0:
                cut = block.find(b"\n")
                if cut < 0:
                    carry = block
                    continue
                carry, block = block[: cut + 1], block[cut + 1:]
            else:
                carry = b""
            if needle is not None and needle not in block:
                continue
            for line in reversed(block.split(b"\n")):
                if line and (needle is None or needle in line):
                    yield line


def read_audit_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every well-formed record of one audit file, in file order, as dicts (for tools and tests)."""
    out: list[dict[str, Any]] = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n") and _seq_of(line) is not None:
                out.append(json.loads(line))
    return out
