"""Attack: swap a path component for a symlink between the check (the card) and the use.

A local process racing relay (or a model's earlier approved ``run_code``) flips a directory on the way to a
pull source or a push target between the real directory and a symlink to ``~/.ssh``, to a directory outside
the Jupyter root, or to the root's own ``.git``, in a loop thread, while ``scratch_pull`` / ``scratch_push`` /
revert go through their real preflight (the card: what the read roots and the protected matcher saw) and
their real execution. The read or write must never follow the swap: every component is opened from the
root's fd with ``O_NOFOLLOW`` (``workspace/fsops.py``), so a call that meets the symlink is refused
(``PATH_REFUSED``) and one that meets the directory does what its card said. Each loop runs until both
outcomes were seen many times (so the race was really run), then checks that no secret was read and
nothing was written outside the one intended directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import CALL_CLASS_KEY, WorkspaceTools

NB = "notebook:proj/a.ipynb"
SECRET = "SECRET-5w4p"
PUBLIC = "public,data\n"
WANT_EACH = 15  # outcomes of each kind to see before a loop stops
MAX_TRIES = 1500


@pytest.fixture
def env(tmp_path: Path):
    home = tmp_path / "home"
    root = home / "root"
    (root / "proj" / "data").mkdir(parents=True)
    (root / "proj" / "data" / "f.txt").write_text(PUBLIC)
    (root / ".git").mkdir()
    (root / ".git" / "f.txt").write_text(SECRET)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "f.txt").write_text(SECRET)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f.txt").write_text(SECRET)
    data = tmp_path / "data"
    journal = CheckpointJournal(data / "relay.db")
    protected = ProtectedPaths.for_jupyter(root, data_dir=data, config_dirs=[tmp_path / "jcfg"],
                                           runtime_dir=tmp_path / "rt")
    tools = WorkspaceTools(WorkspaceManager(data / "workspaces"), root, journal, protected)
    yield SimpleNamespace(root=root, home=home, tmp=tmp_path, tools=tools, journal=journal)
    journal.close()


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (``renameat2(RENAME_EXCHANGE)``): the path is never missing, as an
    attacker's swap would be (a missing parent would just be created again by a push)."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


class Swapper:
    """A thread flipping ``path`` between what it is and a symlink to ``to``, as fast as it can."""

    def __init__(self, path: Path, to: Path) -> None:
        self.path, self.link = path, path.with_name(path.name + ".swap")
        os.symlink(to, self.link)
        self.stop = threading.Event()
        self.flips = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                _exchange(self.path, self.link)  # now a symlink
                os.sched_yield()
                _exchange(self.path, self.link)  # the real one again
                os.sched_yield()
                self.flips += 1
        except BaseException as exc:  # reported by check()
            self.error = exc

    def check(self) -> None:
        assert self.error is None and self.thread.is_alive(), f"the swapper stopped: {self.error!r}"

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive() and self.error is None, self.error
        assert not self.path.is_symlink() and self.link.is_symlink()  # left as found
        self.link.unlink()


def _race(swapper: Swapper, call, *, want: int = WANT_EACH) -> dict[str, int]:
    """Call ``call`` until it both succeeded and was refused ``want`` times; the outcome counts."""
    seen = {"ok": 0, "refused": 0}
    for _ in range(MAX_TRIES):
        swapper.check()
        try:
            call()
            seen["ok"] += 1
        except WorkspaceRefusal as exc:
            assert exc.code.value in ("PATH_REFUSED", "NOT_FOUND", "DIGEST_MISMATCH"), exc.message
            seen["refused"] += 1
        if min(seen.values()) >= want:
            break
    assert min(seen.values()) >= want, f"the race was not exercised: {seen}"
    return seen


def _pull(env, source: str, conv: str) -> bytes:
    t = env.tools
    _r, preview = asyncio.run(t.preflight(conv, "scratch_pull", {"source": source, "path": "p"}, origin=NB))
    asyncio.run(t.call(conv, "scratch_pull", {"source": source, "path": "p"}, origin=NB,
                       approved_preview={k: v for k, v in preview.items() if k != CALL_CLASS_KEY}))
    return t.manager.for_conversation(conv).read("p")


@pytest.mark.parametrize("to", ["home/.ssh", "outside", "home/root/.git"])
def test_a_pull_never_follows_a_directory_swapped_for_a_symlink(env, to: str) -> None:
    """``proj/data`` (under the notebook's read root: no card) flips to a symlink to a secret directory."""
    got: list[bytes] = []
    with Swapper(env.root / "proj" / "data", env.tmp / to) as sw:
        seen = _race(sw, lambda: got.append(_pull(env, "proj/data/f.txt", "c-" + to.replace("/", "-"))))
    assert seen["ok"] == len(got) and all(g == PUBLIC.encode() for g in got), {g for g in got}


def test_a_pull_never_follows_the_file_itself_swapped_for_a_symlink(env) -> None:
    got: list[bytes] = []
    with Swapper(env.root / "proj" / "data" / "f.txt", env.home / ".ssh" / "id_rsa") as sw:
        _race(sw, lambda: got.append(_pull(env, "proj/data/f.txt", "c-file")))
    assert all(g == PUBLIC.encode() for g in got), {g for g in got}


@pytest.mark.parametrize("to", ["home/.ssh", "outside"])
def test_a_push_and_its_revert_never_follow_a_parent_swapped_for_a_symlink(env, to: str) -> None:
    t = env.tools
    conv = "push-" + to.replace("/", "-")
    escaped = env.tmp / to
    before = sorted(p.name for p in escaped.iterdir())
    n = {"i": 0}

    def push() -> None:
        n["i"] += 1
        content = f"line {n['i']}\n"
        asyncio.run(t.call(conv, "scratch_write", {"path": "w.txt", "content": content}))
        args = {"path": "w.txt", "target": f"proj/data/new{n['i'] % 3}.txt"}
        _r, preview = asyncio.run(t.preflight(conv, "scratch_push", args, origin=NB))
        out = asyncio.run(t.call(conv, "scratch_push", args, run_id="r-swap", origin=NB, approved_preview=preview))
        # reverting right away races the swap too
        asyncio.run(t.revert(out["checkpoint"], origin=NB))

    with Swapper(env.root / "proj" / "data", escaped) as sw:
        _race(sw, push, want=10)
    assert sorted(p.name for p in escaped.iterdir()) == before  # nothing written, staged or removed there
    assert (escaped / "f.txt").read_text() == SECRET
    # what landed, landed in the real directory (and was reverted or is a pushed line, never anything else)
    for f in (env.root / "proj" / "data").iterdir():
        assert f.name == "f.txt" or (f.name.startswith("new") and f.read_text().startswith("line ")), f.name
