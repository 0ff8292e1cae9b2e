"""Reading and writing files in the Jupyter root for pull, push and revert.

Every target first passes :class:`core.protected.ProtectedPaths` (literal and resolved forms),
then is opened component by component from the root's fd with ``O_NOFOLLOW`` — a symlink planted
after the check makes the operation fail instead of writing elsewhere — and containment is proven
on the opened directory by device and inode.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from relay_jupyter.core.errors import Code, WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths

from . import fsops

__all__ = ["RootFiles"]


class RootFiles:
    """File access under the Jupyter root, with the protected-path rules applied to every call."""

    def __init__(self, protected: ProtectedPaths, *, max_file_bytes: int) -> None:
        self.protected = protected
        self.max_file_bytes = max_file_bytes

    def check(self, target: str) -> tuple[str, ...]:
        """Validate ``target`` and return its components (``PATH_REFUSED`` when protected)."""
        parts, _resolved = self.protected.resolve(target)
        return parts

    @contextmanager
    def _parent(self, target: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(fd of the target's parent directory, file name), walked from the root's fd with O_NOFOLLOW."""
        parts = self.check(target)
        kwargs = {"create": True, "mode": 0o755} if create else {}
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

    def write(self, target: str, data: bytes) -> None:
        """Write the target atomically (parents created), never through a symlink."""
        with self._parent(target, create=True) as (d, name):
            st = fsops.lstat_at(d, name)
            mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else 0o644
            fsops.write_file_at(d, name, data, mode=mode, shown=target)

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
