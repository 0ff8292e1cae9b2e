"""Clean files (issue 12 item 9): a crash between staging and rename leaves ``.relay-tmp-<hex>``
that reconcile and revert remove (only relay's own, by name and journal); a push keeps the target's
mode, and a new file gets the user's umask, not the process's (the daemon runs under 077)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.rootfiles import current_umask, staged_name
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import WorkspaceTools

ORIGIN = "notebook:n.ipynb"


def make(base: Path, umask: int | None = None) -> tuple[WorkspaceTools, CheckpointJournal]:
    root = base / "root"
    root.mkdir(exist_ok=True)
    journal = CheckpointJournal(base / "data" / "relay.db")
    tools = WorkspaceTools(WorkspaceManager(base / "data" / "workspaces"), root, journal, ProtectedPaths(root),
                           umask=umask)
    return tools, journal


async def push(tools: WorkspaceTools, path: str, target: str, content: str, run_id: str = "r1") -> dict:
    await tools.call("c", "scratch_write", {"path": path, "content": content})
    _r, preview = await tools.preflight("c", "scratch_push", {"path": path, "target": target})
    return await tools.call("c", "scratch_push", {"path": path, "target": target}, run_id=run_id, origin=ORIGIN,
                            approved_preview=preview)


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".relay-tmp-*"))


@pytest.fixture
def daemon_umask():
    """The process runs under 077, as the daemon does (server/daemon.py)."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_a_push_keeps_the_mode_of_an_existing_target(tmp_path: Path, daemon_umask) -> None:
    tools, journal = make(tmp_path, umask=0o022)
    target = tmp_path / "root" / "report.md"
    target.write_text("old\n")
    for mode in (0o644, 0o640, 0o755, 0o600):
        os.chmod(target, mode)
        asyncio.run(push(tools, "r.md", "report.md", f"new {mode:o}\n", run_id=f"r{mode}"))
        assert stat.S_IMODE(target.stat().st_mode) == mode and target.read_text() == f"new {mode:o}\n"
    journal.close()


@pytest.mark.parametrize("user_umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                            (0o077, 0o600, 0o700)])
def test_a_new_file_gets_the_users_umask_not_the_process_one(tmp_path: Path, daemon_umask, user_umask,
                                                             file_mode, dir_mode) -> None:
    tools, journal = make(tmp_path, umask=user_umask)
    asyncio.run(push(tools, "n.txt", "newdir/sub/n.txt", "hello\n"))
    root = tmp_path / "root"
    assert stat.S_IMODE((root / "newdir" / "sub" / "n.txt").stat().st_mode) == file_mode
    assert stat.S_IMODE((root / "newdir").stat().st_mode) == dir_mode
    assert stat.S_IMODE((root / "newdir" / "sub").stat().st_mode) == dir_mode
    journal.close()


def test_set_id_bits_are_not_carried_over(tmp_path: Path) -> None:
    tools, journal = make(tmp_path, umask=0o022)
    target = tmp_path / "root" / "tool.sh"
    target.write_text("#!/bin/sh\n")
    os.chmod(target, 0o4755)
    asyncio.run(push(tools, "t.sh", "tool.sh", "#!/bin/sh\necho hi\n"))
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    journal.close()


def test_current_umask_reads_without_changing_it() -> None:
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(old)


# A real crash between staging and rename: the push runs in its own process, which dies (os._exit)
# at the rename of its staged file, exactly where a SIGKILL or a power cut would leave it.
_CRASH = textwrap.dedent("""
    import asyncio, os, sys
    from pathlib import Path
    real_replace = os.replace
    def crash(src, dst, **kw):
        if str(src).startswith(".relay-tmp-") and os.environ.get("CRASH_AT") == str(dst):
            os._exit(137)
        return real_replace(src, dst, **kw)
    os.replace = crash
    sys.path.insert(0, sys.argv[2])
    from test_files_clean import make, push
    tools, journal = make(Path(sys.argv[1]), umask=0o022)
    asyncio.run(push(tools, "w.txt", sys.argv[3], sys.argv[4], run_id=sys.argv[5]))
    print("pushed")
""")


def crash_push(base: Path, target: str, content: str, run_id: str, crash: bool = True) -> int:
    env = {**os.environ, "CRASH_AT": Path(target).name if crash else ""}
    proc = subprocess.run([sys.executable, "-c", _CRASH, str(base), str(Path(__file__).parent), target, content,
                           run_id], env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode


def test_reconcile_removes_the_staged_file_of_a_crashed_push(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("original\n")
    (root / "docs" / ".relay-tmp-0123456789abcdef").write_text("not relay's: no journal entry names it\n")
    assert crash_push(tmp_path, "docs/a.md", "NEW CONTENT\n", "r1") == 137
    staged = [p for p in leftovers(root) if not p.endswith("0123456789abcdef")]
    assert len(staged) == 1 and (root / staged[0]).read_text() == "NEW CONTENT\n"  # the full content, left
    tools, journal = make(tmp_path, umask=0o022)
    decisions = tools.reconcile()
    assert [d["decision"] for d in decisions] == ["reverted"] and decisions[0]["removed_staged"] == 1
    assert leftovers(root) == ["docs/.relay-tmp-0123456789abcdef"]  # only relay's own was removed
    assert (root / "docs" / "a.md").read_text() == "original\n"
    assert tools.reconcile() == []  # settled: idempotent
    journal.close()


def test_reconcile_removes_the_staged_file_of_a_crashed_new_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert crash_push(tmp_path, "fresh/new.md", "created\n", "r1") == 137
    assert len(leftovers(root)) == 1 and not (root / "fresh" / "new.md").exists()
    tools, journal = make(tmp_path, umask=0o022)
    tools.reconcile()
    assert leftovers(root) == []
    journal.close()


def test_revert_removes_a_staged_leftover_of_its_steps(tmp_path: Path) -> None:
    tools, journal = make(tmp_path, umask=0o022)
    root = tmp_path / "root"
    (root / "a.md").write_text("v0\n")
    out = asyncio.run(push(tools, "a.md", "a.md", "v1\n"))
    step = journal.get(out["checkpoint"])
    # what a crashed second write of the same checkpoint would have left (its name is the journal's)
    left = root / staged_name(f"{step.id}:{step.post_sha256}")
    left.write_text("v1\n")
    foreign = root / ".relay-tmp-ffffffffffffffff"
    foreign.write_text("someone else's\n")
    result = asyncio.run(tools.revert(out["checkpoint"], origin=ORIGIN))
    assert result["complete"] and (root / "a.md").read_text() == "v0\n"
    assert not left.exists() and foreign.exists()
    journal.close()


def test_a_workspace_drops_staged_leftovers_when_first_opened(tmp_path: Path) -> None:
    manager = WorkspaceManager(tmp_path / "ws")
    ws = manager.for_conversation("c")
    ws.write("sub/keep.txt", b"kept\n")
    (ws.root / "sub" / ".relay-tmp-0123456789abcdef").write_bytes(b"half a write\n")  # what a crash leaves
    (ws.root / ".relay-tmp-not-hex").write_bytes(b"not a staged name\n")
    fresh = WorkspaceManager(tmp_path / "ws").for_conversation("c")  # the next process's first open
    assert fresh.removed_staged == 1
    assert sorted(e.path for e in fresh.entries()) == [".relay-tmp-not-hex", "sub", "sub/keep.txt"]
