"""Targets that ``scratch_push`` (and ``scratch_pull``) refuse, even with a human's approval.

Refused, compared case-folded (macOS and Windows file systems are case-insensitive, so ``.GIT``
is ``.git`` there):

* the relay data dir (grants, budgets, journals, workspaces), the Jupyter config dirs and the
  Jupyter runtime dir (connection files, server tokens);
* anything inside a ``.git`` or ``.ipynb_checkpoints`` directory, and any file named ``mcp.json``;
* anything outside the Jupyter root.

The checks run on the path as given *and* on its resolution (``os.path.realpath``, which follows
symlinked parents and leaves a missing tail as is), so a target that does not exist yet is
refused as well, and a symlink inside the root that points at ``.git`` or outside counts as where
it points. Containment is decided by comparing path components, never by a string-prefix test.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import Code, WorkspaceRefusal
from .wspaths import split_relpath

__all__ = ["ProtectedPaths", "PROTECTED_DIR_NAMES", "PROTECTED_FILE_NAMES"]

PROTECTED_DIR_NAMES = frozenset({".git", ".ipynb_checkpoints"})
PROTECTED_FILE_NAMES = frozenset({"mcp.json"})


def _fold(parts: Iterable[str]) -> tuple[str, ...]:
    return tuple(p.casefold() for p in parts)


def _inside(child: tuple[str, ...], parent: tuple[str, ...]) -> bool:
    """True when ``child`` equals ``parent`` or lies under it (component-wise)."""
    return len(child) >= len(parent) and child[: len(parent)] == parent


class ProtectedPaths:
    """The refusal rules for targets in the Jupyter root.

    ``jupyter_root`` is where pushes land; ``protected_dirs`` are the relay data dir and the
    Jupyter config and runtime dirs (see :meth:`for_jupyter`).
    """

    def __init__(self, jupyter_root: Path, protected_dirs: Iterable[Path] = ()) -> None:
        self.root = Path(os.path.realpath(jupyter_root))
        self._root_parts = self.root.parts
        dirs: list[tuple[str, ...]] = []
        for d in protected_dirs:
            for form in {os.path.abspath(d), os.path.realpath(d)}:
                dirs.append(_fold(Path(form).parts))
        self._dirs = tuple(dirs)

    @classmethod
    def for_jupyter(cls, jupyter_root: Path, *, data_dir: Path, config_dirs: Iterable[Path],
                    runtime_dir: Path) -> ProtectedPaths:
        """The standard set: relay data dir, every Jupyter config dir, the runtime dir."""
        return cls(jupyter_root, [data_dir, *config_dirs, runtime_dir])

    def resolve(self, target: str) -> tuple[tuple[str, ...], Path]:
        """Check ``target`` (relative to the Jupyter root) and return (its components, resolved path).

        Raises:
            WorkspaceRefusal: ``PATH_REFUSED`` when the path is malformed or protected.
        """
        parts = split_relpath(target)
        literal = self.root.joinpath(*parts)
        resolved = Path(os.path.realpath(literal))
        reason = self.reason(parts, resolved)
        if reason:
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"target {target!r} is protected: {reason}",
                                   data={"target": target, "reason": reason})
        return parts, resolved

    def reason(self, parts: tuple[str, ...], resolved: Path) -> str | None:
        """Why ``resolved`` (reached from root-relative ``parts``) is refused, or None."""
        res_parts = resolved.parts
        if not _inside(res_parts, self._root_parts) or res_parts == self._root_parts:
            return "it resolves outside the Jupyter root"
        below = res_parts[len(self._root_parts):]
        for seq in (_fold(parts), _fold(below)):
            if any(p in PROTECTED_DIR_NAMES for p in seq):
                return "it is inside a .git or .ipynb_checkpoints directory"
            if seq and seq[-1] in PROTECTED_FILE_NAMES:
                return "MCP server configuration (mcp.json) cannot be written by the agent"
        folded_full = _fold(res_parts)
        folded_literal = _fold(self.root.joinpath(*parts).parts)
        for d in self._dirs:
            if _inside(folded_full, d) or _inside(folded_literal, d) or _inside(d, folded_full):
                return "it is inside the relay data dir or a Jupyter config or runtime dir"
        return None
