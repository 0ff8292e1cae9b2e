"""``workspace.diff``: the caller's own scratch file against the Jupyter-root file of the same path."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.broker.methods import workspace as wm
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.registry import METHODS
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.memory import MemoryAuditSink
from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import WorkspaceTools

ORIGIN = "notebook:a.ipynb"
MINE = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="k1")
OTHER = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="k2")


@pytest.fixture
def env(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    data = tmp_path / "data"
    journal = CheckpointJournal(data / "relay.db")
    protected = ProtectedPaths.for_jupyter(root, data_dir=data, config_dirs=[tmp_path / "cfg"],
                                           runtime_dir=tmp_path / "rt")
    tools = WorkspaceTools(WorkspaceManager(data / "workspaces"), root, journal, protected)
    broker = SimpleNamespace(checkpoints=journal, workspace_tools=tools, audit=MemoryAuditSink(), events=None)
    yield SimpleNamespace(root=root, tools=tools, broker=broker, manager=tools.manager)
    journal.close()


def diff(env, caller: Caller, **params):
    return asyncio.run(wm.workspace_diff(env.broker, caller, wm.WorkspaceDiffParams(**params)))


def write(env, origin: str, name: str, path: str, content: str) -> None:
    asyncio.run(env.tools.call(conversation_key(origin, name), "scratch_write", {"path": path, "content": content}))


def test_registered_with_strict_params() -> None:
    wm_method = METHODS["workspace.diff"]
    assert wm_method is not None
    with pytest.raises(ValueError):
        wm.WorkspaceDiffParams(conversation="default", path="a.txt", extra=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        wm.WorkspaceDiffParams(conversation="", path="a.txt")


def test_diff_of_the_callers_own_scratch_file(env) -> None:
    (env.root / "notes.txt").write_text("one\ntwo\n")
    write(env, ORIGIN, "default", "notes.txt", "one\nTWO\n")
    out = diff(env, MINE, conversation="default", path="notes.txt")
    assert out.target_exists and "--- a/notes.txt" in out.diff and "-two\n+TWO\n" in out.diff
    # a new file: everything added
    write(env, ORIGIN, "default", "new.py", "x = 1\n")
    out = diff(env, MINE, conversation="default", path="new.py")
    assert not out.target_exists and "+x = 1" in out.diff
    # equal content: empty diff with a note
    (env.root / "same.txt").write_text("s\n")
    write(env, ORIGIN, "default", "same.txt", "s\n")
    out = diff(env, MINE, conversation="default", path="same.txt")
    assert out.diff == "" and "same content" in out.note


def test_another_notebooks_conversation_of_the_same_name_is_not_reachable(env) -> None:
    write(env, ORIGIN, "default", "secret.txt", "mine\n")
    with pytest.raises(WorkspaceRefusal) as err:
        diff(env, OTHER, conversation="default", path="secret.txt")
    assert err.value.code.value == "NOT_FOUND"
    # looking did not create a workspace for the other notebook
    assert not env.manager.root_for(conversation_key(OTHER.origin, "default")).exists()


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../b", ".jupyter/x"])
def test_hostile_paths_are_refused(env, path: str) -> None:
    write(env, ORIGIN, "default", "ok.txt", "x\n")
    with pytest.raises(WorkspaceRefusal) as err:
        diff(env, MINE, conversation="default", path=path)
    assert err.value.code.value in ("PATH_REFUSED", "NOT_FOUND")


def test_binary_content_gives_a_note_not_a_diff(env) -> None:
    (env.root / "b.bin").write_bytes(b"\xff\xfe\x00")
    write(env, ORIGIN, "default", "b.bin", "text now\n")
    out = diff(env, MINE, conversation="default", path="b.bin")
    assert out.diff == "" and "binary" in out.note
