"""One scratch workspace per conversation: bounded, symlink-free, mutations serialised.

The root is ``<data dir>/workspaces/ws-<sha256(conversation)[:32]>`` (hashing keeps any
conversation id a safe single name). Every operation opens the path component by component with
``O_NOFOLLOW`` from the root's fd (:mod:`.fsops`) and proves containment on the opened directory.
Quotas — per file, per workspace (bytes) and entries (files + directories, hidden ones counted) —
are checked against a fresh scan before anything is created, so a write that would exceed one
leaves nothing behind, not even a parent directory. A staged ``.relay-tmp-<16 hex>`` file that a crash
left between staging and rename is removed when the workspace is first opened by a process (the
workspace is the broker's own directory: no other program writes there; a concurrent write of
another broker on the same data dir would fail, never land elsewhere).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from relay_jupyter.core.errors import Code, WorkspaceRefusal
from relay_jupyter.core.wspaths import split_relpath

from . import fsops

__all__ = ["Workspace", "WorkspaceManager", "Entry", "Usage", "MiB"]

MiB = 1024 * 1024
_STAGED = re.compile(r"\.relay-tmp-[0-9a-f]{16}")


@dataclass(frozen=True)
class Entry:
    """One file or directory in a workspace listing."""

    path: str
    kind: str
    """``file`` or ``dir``."""
    size: int


@dataclass(frozen=True)
class Usage:
    """What a workspace holds now."""

    bytes: int
    entries: int


class Workspace:
    """A conversation's scratch directory. Thread-safe: one lock serialises every operation."""

    def __init__(self, root: Path, *, max_file_bytes: int = 8 * MiB, max_total_bytes: int = 64 * MiB,
                 max_entries: int = 1000) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_entries = max_entries
        self.lock = threading.RLock()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.removed_staged = self._remove_staged()

    def _remove_staged(self) -> int:
        """Remove crash leftovers of :func:`fsops.write_file_at` (regular files named ``.relay-tmp-<hex>``)."""
        removed = 0
        with self.lock:
            for e in self.entries():
                name = e.path.rsplit("/", 1)[-1]
                if e.kind == "file" and _STAGED.fullmatch(name):
                    parts = tuple(e.path.split("/"))
                    try:
                        with fsops.parent_dir(self.root, parts, shown=e.path) as d:
                            removed += fsops.remove_regular_at(d, parts[-1])
                    except (OSError, WorkspaceRefusal):
                        continue
        return removed

    # -- scanning -------------------------------------------------------------------------

    def _scan(self, fd: int, prefix: str, out: list[Entry], depth: int = 0) -> None:
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            rel = f"{prefix}{name}"
            if stat.S_ISDIR(st.st_mode):
                out.append(Entry(rel, "dir", 0))
                if depth < 64:
                    sub = os.open(name, fsops.DIR_FLAGS, dir_fd=fd)
                    try:
                        self._scan(sub, rel + "/", out, depth + 1)
                    finally:
                        os.close(sub)
            elif stat.S_ISLNK(st.st_mode):
                out.append(Entry(rel, "symlink", 0))  # never created by us; counted, never followed
            else:
                out.append(Entry(rel, "file", st.st_size))

    def entries(self) -> list[Entry]:
        """Every entry (hidden ones included), depth-first, sorted by name."""
        with self.lock:
            root_fd = fsops.open_root(self.root)
            try:
                out: list[Entry] = []
                try:
                    self._scan(root_fd, "", out)
                except OSError as exc:  # the tree changed under the scan (e.g. a planted symlink)
                    raise fsops.oserror_refusal(exc, str(exc.filename or "")) from None
                return out
            finally:
                os.close(root_fd)

    def usage(self) -> Usage:
        """Bytes and entries used now (hidden files and directories count)."""
        items = self.entries()
        return Usage(sum(e.size for e in items), len(items))

    # -- operations -----------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        """The bytes of a workspace file."""
        parts = split_relpath(path)
        with self.lock, fsops.parent_dir(self.root, parts, shown=path) as d:
            return fsops.read_file_at(d, parts[-1], max_bytes=self.max_file_bytes, shown=path)

    def exists(self, path: str) -> bool:
        """True when ``path`` names a regular file in the workspace."""
        try:
            self.stat(path)
            return True
        except WorkspaceRefusal as exc:
            if exc.code is Code.NOT_FOUND:
                return False
            raise

    def stat(self, path: str) -> os.stat_result:
        """``lstat`` of a workspace file (``NOT_FOUND`` when missing)."""
        parts = split_relpath(path)
        with self.lock, fsops.parent_dir(self.root, parts, shown=path) as d:
            st = fsops.lstat_at(d, parts[-1])
        if st is None:
            raise WorkspaceRefusal(Code.NOT_FOUND, f"{path!r} does not exist in the workspace", data={"path": path})
        if stat.S_ISLNK(st.st_mode):
            raise fsops.refuse_symlink(path)
        return st

    def check_quota(self, path: str, size: int) -> None:
        """Raise ``QUOTA_EXCEEDED`` if writing ``size`` bytes at ``path`` would break a limit."""
        parts = split_relpath(path)
        with self.lock:
            self._check_quota(parts, path, size, self.entries())

    def _check_quota(self, parts: tuple[str, ...], path: str, size: int, items: list[Entry]) -> None:
        if size > self.max_file_bytes:
            raise WorkspaceRefusal(
                Code.QUOTA_EXCEEDED,
                f"{path!r} would be {size} bytes; the per-file limit is {self.max_file_bytes} bytes",
                data={"limit": "file", "size": size, "max": self.max_file_bytes})
        by_path = {e.path: e for e in items}
        existing = by_path.get(path)
        if existing is not None and existing.kind != "file":
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{path!r} exists and is not a regular file",
                                   data={"reason": "not a regular file"})
        new_entries = 0 if existing else 1
        for k in range(1, len(parts)):
            parent = "/".join(parts[:k])
            e = by_path.get(parent)
            if e is None:
                new_entries += 1
            elif e.kind != "dir":
                raise WorkspaceRefusal(Code.PATH_REFUSED, f"path {path!r} refused: {parent!r} is not a directory",
                                       data={"reason": "not a directory"})
        total = sum(e.size for e in items) - (existing.size if existing else 0) + size
        if total > self.max_total_bytes:
            raise WorkspaceRefusal(
                Code.QUOTA_EXCEEDED,
                f"writing {path!r} would bring the workspace to {total} bytes; the limit is "
                f"{self.max_total_bytes} bytes (delete files you no longer need)",
                data={"limit": "total", "size": total, "max": self.max_total_bytes})
        count = len(items) + new_entries
        if count > self.max_entries:
            raise WorkspaceRefusal(
                Code.QUOTA_EXCEEDED,
                f"writing {path!r} would make {count} files and directories (hidden ones count); "
                f"the limit is {self.max_entries}",
                data={"limit": "entries", "count": count, "max": self.max_entries})

    def write(self, path: str, data: bytes) -> bool:
        """Create or replace a file atomically; returns True when it was created.

        Raises:
            WorkspaceRefusal: ``PATH_REFUSED`` (bad path, symlink, not a file), ``QUOTA_EXCEEDED``.
        """
        parts = split_relpath(path)
        with self.lock:
            items = self.entries()
            self._check_quota(parts, path, len(data), items)
            created = path not in {e.path for e in items}
            with fsops.parent_dir(self.root, parts, create=True, shown=path) as d:
                fsops.write_file_at(d, parts[-1], data, shown=path)
            return created

    def delete(self, path: str) -> str:
        """Delete a file or an empty directory; returns ``file`` or ``dir``."""
        parts = split_relpath(path)
        with self.lock, fsops.parent_dir(self.root, parts, shown=path) as d:
            st = fsops.lstat_at(d, parts[-1])
            if st is None:
                raise WorkspaceRefusal(Code.NOT_FOUND, f"{path!r} does not exist in the workspace",
                                       data={"path": path})
            if stat.S_ISDIR(st.st_mode):
                try:
                    os.rmdir(parts[-1], dir_fd=d)
                except OSError:
                    raise WorkspaceRefusal(
                        Code.PATH_REFUSED, f"directory {path!r} is not empty; delete its files first",
                        data={"reason": "not empty"}) from None
                return "dir"
            os.unlink(parts[-1], dir_fd=d)  # unlink never follows: a planted symlink is removed
            return "file"


class WorkspaceManager:
    """Creates, finds and deletes the per-conversation workspaces under ``base_dir``."""

    def __init__(self, base_dir: Path | None = None, **limits: int) -> None:
        if base_dir is None:
            from relay_jupyter.storage.paths import data_dir

            base_dir = data_dir() / "workspaces"
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[str, Workspace] = {}

    def root_for(self, conversation: str) -> Path:
        """Where a conversation's workspace lives (a hash, so any id is one safe name)."""
        if not isinstance(conversation, str) or not conversation:
            raise WorkspaceRefusal(Code.PATH_REFUSED, "a conversation id is required for the workspace",
                                   data={"reason": "conversation"})
        digest = hashlib.sha256(conversation.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return self.base_dir / f"ws-{digest}"

    def for_conversation(self, conversation: str) -> Workspace:
        """The conversation's workspace, created on first use."""
        with self._lock:
            ws = self._open.get(conversation)
            if ws is None:
                ws = Workspace(self.root_for(conversation), **self.limits)
                self._open[conversation] = ws
            return ws

    def delete(self, conversation: str) -> bool:
        """Delete a conversation's workspace and everything in it; True when one existed."""
        root = self.root_for(conversation)
        with self._lock:
            ws = self._open.pop(conversation, None)
        lock = ws.lock if ws else threading.RLock()
        with lock:
            st = fsops_lstat(root)
            if st is None:
                return False
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(root)
                return True
            # rmtree refuses to follow symlinks (it uses fd-based, symlink-safe removal on Linux).
            shutil.rmtree(root)
            return True


def fsops_lstat(path: Path) -> os.stat_result | None:
    """``lstat`` or None."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
