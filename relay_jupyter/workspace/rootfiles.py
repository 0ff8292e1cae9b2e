"""Reading and writing files in the Jupyter root for pull, push and revert.

Every target first passes :class:`core.protected.ProtectedPaths` (literal and resolved forms),
then is opened component by component from the root's fd with ``O_NOFOLLOW`` — a symlink planted
after the check makes the operation fail instead of writing elsewhere — and containment is proven
on the opened directory by device and inode.

Modes: a push keeps an existing target's permission bits (set-id bits dropped); a new file gets
``0o666 & ~umask`` and a new parent directory ``0o777 & ~umask``, where ``umask`` is the user's:
the umask the Jupyter server or the daemon was started with (the daemon then sets 077 for its own
files; ``server/daemon.py`` hands the user's value to the assembly). The temp file a write renames
over its target is named after its checkpoint (:func:`staged_name`), so a crash between staging
and rename leaves a file that reconcile and revert know is relay's own and remove.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from relay_jupyter.core.errors import Code, WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths

from . import fsops

__all__ = ["RootFiles", "staged_name", "current_umask"]


def staged_name(tag: str) -> str:
    """The temp file name of the write tagged ``tag`` (a checkpoint id and the digest it stages)."""
    return f"{fsops.STAGED_PREFIX}{hashlib.sha256(tag.encode()).hexdigest()[:16]}"


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; else set-and-restore,
    which another thread could observe for an instant, so only where procfs is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


class RootFiles:
    """File access under the Jupyter root, with the protected-path rules applied to every call."""

    def __init__(self, protected: ProtectedPaths, *, max_file_bytes: int, umask: int | None = None) -> None:
        self.protected = protected
        self.max_file_bytes = max_file_bytes
        self.umask = (current_umask() if umask is None else int(umask)) & 0o777
        self.new_file_mode = 0o666 & ~self.umask
        self.new_dir_mode = 0o777 & ~self.umask

    def check(self, target: str) -> tuple[str, ...]:
        """Validate ``target`` and return its components (``PATH_REFUSED`` when protected)."""
        parts, _resolved = self.protected.resolve(target)
        return parts

    @contextmanager
    def _parent(self, target: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(fd of the target's parent directory, file name), walked from the root's fd with O_NOFOLLOW."""
        parts = self.check(target)
        kwargs = {"create": True, "mode": self.new_dir_mode} if create else {}
        with fsops.parent_dir(self.protected.root, parts, shown=target, **kwargs) as d:
            yield d, parts[-1]

    def read(self, target: str) -> bytes | None:
        """The target's bytes, or None when it does not exist."""
        try:
            with self._parent(target) as (d, name):
                st = fsops.lstat_at(d, name)
                if st is None:
                    return None
                if stat.S_ISLNK(st.st_mode):
                    raise fsops.refuse_symlink(target)
                return fsops.read_file_at(d, name, max_bytes=self.max_file_bytes, shown=target)
        except WorkspaceRefusal as exc:
            if exc.code is Code.NOT_FOUND:
                return None
            raise

    def size(self, target: str) -> int | None:
        """The target's size from ``lstat`` (nothing read), or None when it does not exist."""
        try:
            with self._parent(target) as (d, name):
                st = fsops.lstat_at(d, name)
        except WorkspaceRefusal as exc:
            if exc.code is Code.NOT_FOUND:
                return None
            raise
        if st is None:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise fsops.refuse_symlink(target)
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{target!r} is not a regular file",
                                   data={"reason": "not a regular file"})
        return st.st_size

    def write(self, target: str, data: bytes, *, tag: str | None = None) -> None:
        """Write the target atomically (parents created), never through a symlink; an existing file
        keeps its mode, a new one gets the user's (see the module doc). ``tag`` names the temp file
        (:func:`staged_name`) so that a crash's leftover can be found."""
        with self._parent(target, create=True) as (d, name):
            st = fsops.lstat_at(d, name)
            if st is not None and stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            else:
                mode = self.new_file_mode
            fsops.write_file_at(d, name, data, mode=mode, shown=target,
                                tmp_name=staged_name(tag) if tag else None)

    def remove_staged(self, target: str, tag: str) -> bool:
        """Remove the temp file a write of ``target`` tagged ``tag`` staged and a crash left; True
        when there was one. Only that exact name, and only a regular file, is ever removed."""
        try:
            with self._parent(target) as (d, _name):
                if fsops.remove_regular_at(d, staged_name(tag)):
                    os.fsync(d)
                    return True
                return False
        except WorkspaceRefusal as exc:
            if exc.code is Code.NOT_FOUND:
                return False
            raise

    def remove(self, target: str) -> bool:
        """Delete the target file (revert of a push that created it); False when already gone."""
        try:
            with self._parent(target) as (d, name):
                st = fsops.lstat_at(d, name)
                if st is None:
                    return False
                if not stat.S_ISREG(st.st_mode):
                    raise WorkspaceRefusal(Code.PATH_REFUSED, f"{target!r} is not a regular file",
                                           data={"reason": "not a regular file"})
                os.unlink(name, dir_fd=d)
                os.fsync(d)
                return True
        except WorkspaceRefusal as exc:
            if exc.code is Code.NOT_FOUND:
                return False
            raise
