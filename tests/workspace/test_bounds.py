"""Resource bounds before work (issue 11 item 7): an edit's result size is known from its matches
and refused before it is built; a pull and a diff stat before they read."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relay_jupyter.broker.methods import workspace as wm
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.edit import MAX_REPLACEMENTS, Edit, apply_edits
from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import MAX_PREVIEW_DIFF_INPUT, WorkspaceTools


def test_a_result_over_the_bound_is_refused_before_it_is_built() -> None:
    content = b"x\n" * 50_000  # 100 kB
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(content, [Edit("x", "y" * 1500, replace_all=True)], path="f.txt", max_result_bytes=8 << 20)
    assert exc.value.code.value == "QUOTA_EXCEEDED"
    assert exc.value.data["size"] == 50_000 * 1500 + 50_000 and exc.value.data["replacements"] == 50_000
    # exactly at the bound is fine; one byte over is not
    exact = len(content) + 50_000
    assert len(apply_edits(content, [Edit("x", "yy", replace_all=True)], max_result_bytes=exact).content) == exact
    with pytest.raises(WorkspaceRefusal):
        apply_edits(content, [Edit("x", "yy", replace_all=True)], max_result_bytes=exact - 1)


def test_the_number_of_replacements_is_bounded() -> None:
    content = b"a" * (MAX_REPLACEMENTS + 1)
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(content, [Edit("a", "a", replace_all=True)])
    assert exc.value.code.value == "QUOTA_EXCEEDED" and "replacements" in exc.value.message
    assert apply_edits(content[:-1], [Edit("a", "b", replace_all=True)]).replacements == MAX_REPLACEMENTS


_RSS_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from relay_jupyter.core.errors import WorkspaceRefusal
    from relay_jupyter.storage.checkpoints import CheckpointJournal
    from relay_jupyter.workspace.scratch import WorkspaceManager
    from relay_jupyter.workspace.tools import WorkspaceTools

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    base = Path(sys.argv[1])
    (base / "root").mkdir()
    journal = CheckpointJournal(base / "data" / "relay.db")
    tools = WorkspaceTools(WorkspaceManager(base / "data" / "workspaces"), base / "root", journal)
    asyncio.run(tools.call("c", "scratch_write", {"path": "f.txt", "content": "x\\n" * 50_000}))
    edits = [{"old_text": "x", "new_text": "y" * 3000, "replace_all": True}]  # 100 kB -> 150 MB
    before = hwm()
    try:
        asyncio.run(tools.call("c", "scratch_edit", {"path": "f.txt", "edits": edits}))
        code = None
    except WorkspaceRefusal as exc:
        code = exc.code.value
    print(json.dumps({"code": code, "before": before, "after": hwm(),
                      "size": len(tools.manager.for_conversation("c").read("f.txt"))}))
""")


def test_an_edit_over_the_quota_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    """The 100 kB -> 150 MB ``replace_all`` of the issue, in its own process: the peak RSS (VmHWM)
    grows by a few MB, not by the result's size (the old code took ~470 MB before refusing)."""
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["code"] == "QUOTA_EXCEEDED"
    assert got["size"] == 100_000  # the file is untouched
    grew = got["after"] - got["before"]
    assert grew < 32 * 1024 * 1024, f"peak RSS grew by {grew / 2**20:.1f} MiB"


def _tools(tmp_path: Path) -> tuple[WorkspaceTools, Path]:
    root = tmp_path / "root"
    root.mkdir()
    journal = CheckpointJournal(tmp_path / "data" / "relay.db")
    return WorkspaceTools(WorkspaceManager(tmp_path / "data" / "workspaces"), root, journal,
                          ProtectedPaths(root)), root


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_a_huge_pull_is_refused_from_stat(tmp_path: Path) -> None:
    tools, root = _tools(tmp_path)
    _sparse(root / "huge.csv", 64 << 30)  # 64 GiB sparse: reading it would not end in a test's lifetime
    with pytest.raises(WorkspaceRefusal) as exc:
        asyncio.run(tools.call("c", "scratch_pull", {"source": "huge.csv", "path": "h.csv"}, origin="notebook:n.ipynb"))
    assert exc.value.code.value == "QUOTA_EXCEEDED"
    assert not tools.manager.for_conversation("c").exists("h.csv")


def test_a_diff_of_huge_files_is_bounded_before_reading(tmp_path: Path) -> None:
    tools, root = _tools(tmp_path)
    asyncio.run(tools.call("c", "scratch_write", {"path": "big.txt", "content": "a\n"}))
    _sparse(root / "big.txt", 64 << 30)
    from relay_jupyter.broker.conversation_keys import conversation_key

    caller = Caller(kind=CallerKind.KERNEL, origin="notebook:n.ipynb", client_id="kernel:k")
    key = conversation_key(caller.origin, "c")
    tools.manager.for_conversation(key).write("big.txt", b"a\n")

    class B:
        workspace_tools = tools

    out = asyncio.run(wm.workspace_diff(B(), caller, wm.WorkspaceDiffParams(conversation="c", path="big.txt")))
    assert out.diff == "" and "too large" in out.note and out.target_exists
    assert (64 << 30) > MAX_PREVIEW_DIFF_INPUT
    os.unlink(root / "big.txt")


def test_the_relaxed_retry_is_not_built_for_a_huge_file() -> None:
    from relay_jupyter.core.edit import MAX_FUZZY_LINES

    small = b"x = \xe2\x80\x9cquoted\xe2\x80\x9d\n"  # smart quotes: only the relaxed retry matches '"quoted"'
    assert apply_edits(small, [Edit('x = "quoted"', "y")]).fuzzy == (0,)
    huge = small + b"pad\n" * (MAX_FUZZY_LINES + 1)
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(huge, [Edit('x = "quoted"', "y")])
    assert exc.value.code.value == "EDIT_NO_MATCH" and "relaxed retry" in exc.value.message
    assert apply_edits(huge, [Edit("x = \u201cquoted\u201d", "y")]).replacements == 1  # exact still works
