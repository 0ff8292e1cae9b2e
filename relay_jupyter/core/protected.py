"""Targets that ``scratch_push`` and ``scratch_pull`` refuse, even with a human's approval, and the
read roots inside which ``scratch_pull`` needs no card.

Refused (``PATH_REFUSED``), for push and pull alike, compared case-folded (macOS and Windows file
systems are case-insensitive, so ``.GIT`` is ``.git`` there), component-wise, on the path as given
*and* on its resolution (``os.path.realpath``: symlinked parents followed, a missing tail left as
is, so a target that does not exist yet is refused as well, and a symlink inside the root that
points at a protected place counts as where it points):

* anything outside the Jupyter root;
* **by role**: the relay data dir (grants, budgets, journals, workspaces), every Jupyter config,
  data and runtime dir the server uses (``jupyter --paths``: ``.py`` configs there run at the next
  start, connection files and tokens live there), and the configured MCP config and secrets file
  *whatever their names* (the caller passes them in: :meth:`ProtectedPaths.for_jupyter`);
* **by name**: anything inside a ``.git`` or ``.ipynb_checkpoints`` directory, any file named
  ``mcp.json``;
* **credential stores**: :data:`CREDENTIAL_DIRS`, :data:`CREDENTIAL_PATHS`, the names and globs of
  :data:`CREDENTIAL_GLOBS` (every component is matched), plus the caller's ``secret_globs``
  (``c.RelayApp.secret_globs``). Their bytes would go to the model provider on a pull, and a push
  there (``.ssh/authorized_keys``, ``.aws/config``) changes who can log in or what runs.

Containment is decided by comparing path components, never by a string-prefix test.
"""

from __future__ import annotations

import fnmatch
import os
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from .errors import Code, ConfigRefusal, WorkspaceRefusal
from .wspaths import split_relpath

__all__ = [
    "ProtectedPaths", "ReadRoots", "PROTECTED_DIR_NAMES", "PROTECTED_FILE_NAMES", "CREDENTIAL_DIRS",
    "CREDENTIAL_PATHS", "CREDENTIAL_GLOBS", "NOTEBOOK_DIR", "notebook_dir",
]

PROTECTED_DIR_NAMES = frozenset({".git", ".ipynb_checkpoints"})
PROTECTED_FILE_NAMES = frozenset({"mcp.json"})
#: Directories whose whole content is credentials (matched as consecutive components anywhere).
CREDENTIAL_DIRS: tuple[tuple[str, ...], ...] = (
    (".ssh",), (".aws",), (".gnupg",), (".config", "gcloud"), (".azure",), (".kube",),
)
#: Single credential files named by a path (matched as consecutive components anywhere).
CREDENTIAL_PATHS: tuple[tuple[str, ...], ...] = ((".docker", "config.json"),)
#: Names (fnmatch globs, case-folded) of credential files; matched against every component.
CREDENTIAL_GLOBS: tuple[str, ...] = (
    ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".env", ".env.*", "*.pem", "*.key",
    "id_rsa*", "id_ed25519*", "id_ecdsa*",
)
#: The entry of ``read_roots`` that stands for the directory of the calling notebook.
NOTEBOOK_DIR = "{notebook_dir}"

_WHY_CREDENTIAL = ("relay never lets the agent read a credential (its bytes would go to the model "
                   "provider) or write one, even with approval")


def _fold_name(name: str) -> str:
    """One name as the matcher compares it: NFKC, case-folded, NFKC again (Unicode's NFKC_Casefold
    without its removal of ignorables, which ``wspaths`` refuses outright). macOS file systems are
    normalization-insensitive (``cafe\u0301`` and ``caf\u00e9`` name one file) and case-insensitive
    (``\u212a`` is ``k``); compatibility forms (full-width ``\uff0essh``) are folded too, which only
    refuses more."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def _fold(parts: Iterable[str]) -> tuple[str, ...]:
    # a full-width solidus folds to "/": split there, so ".ssh\uff0fid_rsa" is matched as ".ssh", "id_rsa"
    return tuple(q for p in parts for q in ((p,) if p == "/" else _fold_name(p).split("/")) if q)


def _inside(child: tuple[str, ...], parent: tuple[str, ...]) -> bool:
    """True when ``child`` equals ``parent`` or lies under it (component-wise)."""
    return len(child) >= len(parent) and child[: len(parent)] == parent


def _contains_run(seq: tuple[str, ...], run: tuple[str, ...]) -> bool:
    """True when ``run`` occurs as consecutive components of ``seq``."""
    k = len(run)
    return any(seq[i:i + k] == run for i in range(len(seq) - k + 1))


def _forms(path: os.PathLike[str] | str) -> set[tuple[str, ...]]:
    return {_fold(Path(form).parts) for form in (os.path.abspath(path), os.path.realpath(path))}


class ProtectedPaths:
    """The refusal rules for targets in the Jupyter root.

    ``jupyter_root`` is where pushes land and pulls read; ``protected_dirs`` are directories refused
    by role (each a path, or ``(path, label)`` where the label names the role in the refusal);
    ``protected_files`` single files refused by role (the MCP config, the secrets file);
    ``secret_globs`` more credential globs (a glob without ``/`` matches any one component, one with
    ``/`` the whole root-relative path).
    """

    def __init__(self, jupyter_root: Path, protected_dirs: Iterable[Path | tuple[Path, str]] = (), *,
                 protected_files: Iterable[Path | tuple[Path, str]] = (),
                 secret_globs: Iterable[str] = ()) -> None:
        self.root = Path(os.path.realpath(jupyter_root))
        self._root_parts = self.root.parts
        dirs: list[tuple[tuple[str, ...], str]] = []
        for entry in protected_dirs:
            path, label = entry if isinstance(entry, tuple) else (entry, "a relay or Jupyter directory")
            dirs += [(form, label) for form in _forms(path)]
        self._dirs = tuple(dirs)
        files: list[tuple[tuple[str, ...], str]] = []
        for entry in protected_files:
            path, label = entry if isinstance(entry, tuple) else (entry, "a relay configuration file")
            files += [(form, label) for form in _forms(path)]
        self._files = tuple(files)
        name_globs, path_globs = [], []
        for g in secret_globs:
            if not isinstance(g, str) or not g.strip("/"):
                raise ConfigRefusal(Code.CONFIG_INVALID, f"secret_globs: {g!r} is not a glob")
            (path_globs if "/" in g.strip("/") else name_globs).append(_fold_name(g.strip("/")))
        self._name_globs = tuple(CREDENTIAL_GLOBS) + tuple(name_globs)
        self._path_globs = tuple(path_globs)

    @classmethod
    def for_jupyter(cls, jupyter_root: Path, *, data_dir: Path, config_dirs: Iterable[Path],
                    runtime_dir: Path, data_dirs: Iterable[Path] = (), mcp_config: Path | None = None,
                    secrets_file: Path | None = None, secret_globs: Iterable[str] = ()) -> ProtectedPaths:
        """The standard set: the relay data dir, every Jupyter config and data dir, the runtime dir,
        the MCP config and the secrets file (as plain paths: the server layer asks jupyter_core)."""
        dirs: list[Path | tuple[Path, str]] = [(data_dir, "the relay data dir (grants, budgets, journals)")]
        dirs += [(d, "a Jupyter config dir (its .py configs run at the next start)") for d in config_dirs]
        dirs += [(d, "a Jupyter data dir (kernelspecs, extensions)") for d in data_dirs]
        dirs.append((runtime_dir, "the Jupyter runtime dir (connection files, server tokens)"))
        files: list[Path | tuple[Path, str]] = []
        if mcp_config is not None:
            files.append((mcp_config, "the MCP configuration (it chooses which commands the broker starts)"))
        if secrets_file is not None:
            files.append((secrets_file, "the relay secrets file (API keys)"))
        return cls(jupyter_root, dirs, protected_files=files, secret_globs=secret_globs)

    def resolve(self, target: str) -> tuple[tuple[str, ...], Path]:
        """Check ``target`` (relative to the Jupyter root) and return (its components, resolved path).

        Raises:
            WorkspaceRefusal: ``PATH_REFUSED`` when the path is malformed or protected.
        """
        parts = split_relpath(target)
        literal = self.root.joinpath(*parts)
        try:
            resolved = Path(os.path.realpath(literal))
        except OSError:  # a component swapped while realpath read it (lstat saw a link, readlink did not)
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{target!r} is refused: it changed while it was checked",
                                   data={"target": target, "reason": "changed while checked"}) from None
        reason = self.reason(parts, resolved)
        if reason:
            raise WorkspaceRefusal(Code.PATH_REFUSED, f"{target!r} is refused: {reason}",
                                   data={"target": target, "reason": reason})
        return parts, resolved

    def below_root(self, resolved: Path) -> tuple[str, ...] | None:
        """The components of ``resolved`` below the Jupyter root (None when outside it)."""
        res = Path(resolved).parts
        if not _inside(res, self._root_parts):
            return None
        return res[len(self._root_parts):]

    def reason(self, parts: tuple[str, ...], resolved: Path) -> str | None:
        """Why ``resolved`` (reached from root-relative ``parts``) is refused, or None."""
        res_parts = resolved.parts
        if not _inside(res_parts, self._root_parts) or res_parts == self._root_parts:
            return "it resolves outside the Jupyter root"
        below = res_parts[len(self._root_parts):]
        seqs = (_fold(parts), _fold(below))
        for seq in seqs:
            if any(p in PROTECTED_DIR_NAMES for p in seq):
                return "it is inside a .git or .ipynb_checkpoints directory (version control and " \
                       "Jupyter's own checkpoints are never touched by the agent)"
            if seq and seq[-1] in PROTECTED_FILE_NAMES:
                return "it is an MCP configuration (mcp.json chooses which commands the broker starts)"
        folded_full = _fold(res_parts)
        folded_literal = _fold(self.root.joinpath(*parts).parts)
        for form, label in self._files:
            if form in (folded_full, folded_literal):
                return f"it is {label}"
        for d, label in self._dirs:
            if _inside(folded_full, d) or _inside(folded_literal, d) or _inside(d, folded_full):
                return f"it is inside {label}"
        for seq in seqs:
            cred = self._credential(seq)
            if cred:
                return f"{cred}; {_WHY_CREDENTIAL}"
        # a root that is itself inside a credential store (a Jupyter root of ~/.config, whose gcloud/ is one):
        # the store's runs are matched on the whole resolved path too (names only below the root)
        for run in CREDENTIAL_DIRS + CREDENTIAL_PATHS:
            if _contains_run(folded_full, run):
                return f"it is inside a credential store ({'/'.join(run)}); {_WHY_CREDENTIAL}"
        return None

    def credential(self, path: os.PathLike[str] | str) -> str | None:
        """Why ``path`` (absolute, anywhere — not only in the Jupyter root) is a credential relay never
        reads or writes, with the reason; None when it is not one. Matched component-wise, case-folded."""
        cred = self._credential(_fold(Path(path).parts))
        return f"{cred}; {_WHY_CREDENTIAL}" if cred else None

    def _credential(self, seq: tuple[str, ...]) -> str | None:
        for run in CREDENTIAL_DIRS:
            if _contains_run(seq, run):
                return f"it is inside a credential store ({'/'.join(run)}/)"
        for run in CREDENTIAL_PATHS:
            if _contains_run(seq, run):
                return f"it is a credential file ({'/'.join(run)})"
        for name in seq:
            for g in self._name_globs:
                if fnmatch.fnmatchcase(name, g):
                    return f"it is a credential file (matches {g!r})"
        joined = "/".join(seq)
        for g in self._path_globs:
            if fnmatch.fnmatchcase(joined, g) or any(fnmatch.fnmatchcase("/".join(seq[:k]), g)
                                                     for k in range(1, len(seq))):
                return f"it matches the secret glob {g!r}"
        return None


def notebook_dir(origin: str | None) -> tuple[str, ...] | None:
    """The root-relative directory of a ``notebook:<path>`` origin (None for any other origin, or a
    path that is not a plain relative path)."""
    if not isinstance(origin, str) or not origin.startswith("notebook:"):
        return None
    try:
        parts = split_relpath(origin[len("notebook:"):])
    except WorkspaceRefusal:
        return None
    return parts[:-1]


class ReadRoots:
    """Where a pull needs no card: directories relative to the Jupyter root.

    Each entry is :data:`NOTEBOOK_DIR` (the calling notebook's own directory, with everything below
    it; nothing for an origin that is not a notebook, such as ``daemon:<name>``), ``.`` (the whole
    Jupyter root) or a relative directory. An empty list makes every pull ask.
    """

    def __init__(self, entries: Iterable[str] = (NOTEBOOK_DIR,)) -> None:
        self.notebook = False
        fixed: list[tuple[str, ...]] = []
        for entry in entries:
            if entry == NOTEBOOK_DIR:
                self.notebook = True
            elif entry in (".", "./"):
                fixed.append(())
            else:
                try:
                    fixed.append(split_relpath(entry))
                except WorkspaceRefusal as exc:
                    why = exc.data.get("reason", exc.message)
                    raise ConfigRefusal(Code.CONFIG_INVALID,
                                        f"c.RelayApp.read_roots: {entry!r} is not a directory relative to the "
                                        f"Jupyter root ({why}); use '{NOTEBOOK_DIR}', '.' or a path like "
                                        "'data/shared'") from None
        self.fixed = tuple(fixed)

    def roots_for(self, origin: str | None) -> list[tuple[str, ...]]:
        """The read roots of ``origin`` (root-relative components)."""
        out = list(self.fixed)
        nb = notebook_dir(origin) if self.notebook else None
        if nb is not None:
            out.append(nb)
        return out

    def covers(self, origin: str | None, *forms: tuple[str, ...] | None) -> bool:
        """True when every one of ``forms`` (root-relative components: the path as given and its
        resolution) lies under one read root of ``origin``. Compared exactly (not case-folded: a
        looser match would only widen what is read without a card)."""
        roots = self.roots_for(origin)
        return all(f is not None and any(_inside(f, r) for r in roots) for f in forms)

    def describe(self, origin: str | None) -> str:
        """The read roots of ``origin`` in words (for the card)."""
        roots = self.roots_for(origin)
        if not roots:
            return "none (every pull asks)"
        return ", ".join("the whole Jupyter root" if not r else "/".join(r) + "/" for r in roots)
