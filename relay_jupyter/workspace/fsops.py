"""Directory-fd file operations that never follow a symlink and prove where they landed.

Every path is walked one component at a time from an open directory fd with
``O_NOFOLLOW | O_DIRECTORY`` (``openat``-style, ``dir_fd=``), so a symlink anywhere on the way —
including one planted between a check and a use — makes the open fail instead of leading
elsewhere. After the walk, :func:`prove_inside` climbs ``..`` from the opened directory and
compares device and inode numbers with the root's: a directory moved out of the tree mid-walk is
caught, and no string-prefix comparison is involved.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from relay_jupyter.core.errors import Code, WorkspaceRefusal

__all__ = [
    "DIR_FLAGS", "open_root", "walk_dirs", "parent_dir", "prove_inside", "read_file_at", "write_file_at",
    "lstat_at", "refuse_symlink", "oserror_refusal", "remove_regular_at", "STAGED_PREFIX",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)


def refuse_symlink(shown: str) -> WorkspaceRefusal:
    """The refusal for a symlink on a path (even one pointing inside)."""
    return WorkspaceRefusal(Code.PATH_REFUSED,
                            f"path {shown!r} refused: it goes through a symlink, and symlinks are never followed",
                            data={"reason": "symlink"})


def oserror_refusal(exc: OSError, shown: str) -> WorkspaceRefusal:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return refuse_symlink(shown)
    if exc.errno == errno.ENOTDIR:
        # O_DIRECTORY|O_NOFOLLOW on a symlink also gives ENOTDIR: say both.
        return WorkspaceRefusal(Code.PATH_REFUSED,
                                f"path {shown!r} refused: a parent is not a directory (or is a symlink)",
                                data={"reason": "not a directory"})
    if exc.errno == errno.ENOENT:
        return WorkspaceRefusal(Code.NOT_FOUND, f"{shown!r} does not exist", data={"path": shown})
    return WorkspaceRefusal(Code.PATH_REFUSED, f"path {shown!r} refused: {exc.strerror}",
                            data={"reason": exc.strerror or "error"})


def open_root(path: str | os.PathLike[str]) -> int:
    """Open a root directory (itself not a symlink) and return its fd."""
    return os.open(path, DIR_FLAGS)


@contextmanager
def parent_dir(root: str | os.PathLike[str], parts: tuple[str, ...], *, create: bool = False, shown: str = "",
               mode: int = 0o700) -> Iterator[int]:
    """Yield an fd of the directory holding ``parts[-1]`` below ``root``: the root is opened, the path walked
    with ``O_NOFOLLOW`` (see :func:`walk_dirs`), and everything closed afterwards."""
    root_fd = open_root(root)
    try:
        with walk_dirs(root_fd, parts[:-1], create=create, shown=shown, mode=mode) as d:
            yield d
    finally:
        os.close(root_fd)


@contextmanager
def walk_dirs(root_fd: int, parts: tuple[str, ...], *, create: bool = False, shown: str = "",
              mode: int = 0o700) -> Iterator[int]:
    """Yield an fd of the directory ``parts`` below ``root_fd`` (missing ones created with ``mode``)."""
    fds: list[int] = []
    cur = root_fd
    try:
        try:
            for name in parts:
                try:
                    nxt = os.open(name, DIR_FLAGS, dir_fd=cur)
                except FileNotFoundError:
                    if not create:
                        raise
                    made = True
                    try:
                        os.mkdir(name, mode, dir_fd=cur)
                    except FileExistsError:
                        made = False
                    nxt = os.open(name, DIR_FLAGS, dir_fd=cur)
                    if made:  # the mode asked for, whatever the process umask is now
                        os.fchmod(nxt, mode)
                fds.append(nxt)
                cur = nxt
            prove_inside(root_fd, cur, len(parts), shown=shown)
        except OSError as exc:  # only errors of the walk itself become refusals
            raise oserror_refusal(exc, shown or "/".join(parts)) from None
        yield cur
    finally:
        for fd in fds:
            os.close(fd)


def prove_inside(root_fd: int, dir_fd: int, depth: int, *, shown: str = "") -> None:
    """Raise ``PATH_REFUSED`` unless climbing ``depth`` times ``..`` from ``dir_fd`` reaches the root."""
    want = os.fstat(root_fd)
    fds: list[int] = []
    cur = dir_fd
    try:
        for _ in range(depth):
            cur = os.open("..", DIR_FLAGS, dir_fd=cur)
            fds.append(cur)
        got = os.fstat(cur)
    finally:
        for fd in fds:
            os.close(fd)
    if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
        raise WorkspaceRefusal(Code.PATH_REFUSED,
                               f"path {shown!r} refused: it no longer lies under its root (moved?)",
                               data={"reason": "containment"})


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in ``dir_fd``, or None when it does not exist."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_file_at(dir_fd: int, name: str, *, max_bytes: int, shown: str) -> bytes:
    """Read a regular file (never through a symlink), refusing one larger than ``max_bytes``."""
    try:
        fd = os.open(name, _FILE_READ, dir_fd=dir_fd)
    except OSError as exc:
        raise oserror_refusal(exc, shown) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{shown!r} is a directory, not a file",
                                   data={"reason": "directory"})
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{shown!r} is not a regular file",
                                   data={"reason": "not a regular file"})
        if st.st_size > max_bytes:
            raise WorkspaceRefusal(Code.QUOTA_EXCEEDED,
                                   f"{shown!r} is {st.st_size} bytes, over the {max_bytes}-byte file limit",
                                   data={"size": st.st_size, "limit": max_bytes})
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # it grew while we read it
            raise WorkspaceRefusal(Code.QUOTA_EXCEEDED, f"{shown!r} is over the {max_bytes}-byte file limit",
                                   data={"limit": max_bytes})
        return data
    finally:
        os.close(fd)


#: Prefix of the staged file a write renames over its target (``.relay-tmp-<16 hex>``).
STAGED_PREFIX = ".relay-tmp-"


def write_file_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, shown: str,
                  tmp_name: str | None = None) -> None:
    """Write ``name`` atomically: a temp file in the same directory, fsync, ``rename`` over it.

    The temp file is created 0600 and set to ``mode`` with ``fchmod`` just before the rename, so the
    result has exactly ``mode`` whatever the process umask is (the daemon runs under 077). Refuses
    when ``name`` is a symlink or a directory. A failure removes the temp file, so nothing of a
    failed write is left behind; a crash can leave it, which is why a caller may name it
    (``tmp_name``, see ``rootfiles.staged_name``) and remove it later. A leftover of that very
    name (a regular file) is replaced.
    """
    st = lstat_at(dir_fd, name)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise refuse_symlink(shown)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise WorkspaceRefusal(Code.PATH_REFUSED, f"{shown!r} exists and is not a regular file",
                               data={"reason": "not a regular file"})
    tmp = tmp_name or f"{STAGED_PREFIX}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        if tmp_name is None or not remove_regular_at(dir_fd, tmp):
            raise
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    os.fsync(dir_fd)


def remove_regular_at(dir_fd: int, name: str) -> bool:
    """Unlink ``name`` in ``dir_fd`` when it is a regular file (never a symlink or a directory)."""
    st = lstat_at(dir_fd, name)
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    os.unlink(name, dir_fd=dir_fd)
    return True
