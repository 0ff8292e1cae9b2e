"""The scratch workspace: fd walks, symlinks refused, containment, quotas that leave nothing behind."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.workspace import fsops
from relay_jupyter.workspace.scratch import Workspace, WorkspaceManager


def code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.code.value


def test_write_read_list_delete(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    assert ws.write("a/b.txt", b"hi") is True
    assert ws.write("a/b.txt", b"hello") is False
    assert ws.read("a/b.txt") == b"hello"
    assert [(e.path, e.kind) for e in ws.entries()] == [("a", "dir"), ("a/b.txt", "file")]
    assert ws.delete("a/b.txt") == "file" and ws.delete("a") == "dir"
    with pytest.raises(WorkspaceRefusal) as exc:
        ws.read("a/b.txt")
    assert code(exc) == "NOT_FOUND"


def test_symlinks_are_refused_even_pointing_inside(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.write("real.txt", b"x")
    os.symlink(ws.root / "real.txt", ws.root / "alias.txt")
    os.mkdir(ws.root / "d")
    os.symlink(ws.root / "d", ws.root / "dlink")
    for op in (lambda: ws.read("alias.txt"), lambda: ws.write("alias.txt", b"y"),
               lambda: ws.read("dlink/x"), lambda: ws.write("dlink/x", b"y")):
        with pytest.raises(WorkspaceRefusal) as exc:
            op()
        assert code(exc) == "PATH_REFUSED"
    assert ws.read("real.txt") == b"x"


def test_sibling_workspace_is_unreachable(tmp_path: Path) -> None:
    evil = tmp_path / "ws-evil"
    evil.mkdir()
    (evil / "secret.txt").write_bytes(b"s")
    ws = Workspace(tmp_path / "ws")
    os.symlink(evil, ws.root / "e")
    for path in ("../ws-evil/secret.txt", "e/secret.txt"):
        with pytest.raises(WorkspaceRefusal):
            ws.read(path)


def test_symlink_planted_between_check_and_use(tmp_path: Path) -> None:
    """A directory swapped for a symlink after validation makes the open fail: nothing escapes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = Workspace(tmp_path / "ws")
    ws.write("d/f.txt", b"inside")
    real_open = os.open

    def swapping_open(path, flags, *args, **kwargs):
        if path == "d" and kwargs.get("dir_fd") is not None and (ws.root / "d").is_dir() \
                and not (ws.root / "d").is_symlink():
            os.rename(ws.root / "d", ws.root / "d.moved")
            os.symlink(outside, ws.root / "d")
        return real_open(path, flags, *args, **kwargs)

    with mock.patch("relay_jupyter.workspace.fsops.os.open", side_effect=swapping_open):
        with pytest.raises(WorkspaceRefusal) as exc:
            ws.write("d/f.txt", b"pwned")
    assert code(exc) == "PATH_REFUSED"
    assert list(outside.iterdir()) == []


def test_directory_moved_out_mid_walk_fails_containment(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.write("d/e/f.txt", b"x")
    root_fd = fsops.open_root(ws.root)
    try:
        d = os.open("d", fsops.DIR_FLAGS, dir_fd=root_fd)
        os.rename(ws.root / "d", tmp_path / "d-outside")  # the fd now points outside the root
        with pytest.raises(WorkspaceRefusal):
            fsops.prove_inside(root_fd, d, 1)
        os.close(d)
    finally:
        os.close(root_fd)


def test_file_quota_edges(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", max_file_bytes=100, max_total_bytes=1000, max_entries=10)
    ws.write("limit.bin", b"x" * 100)
    with pytest.raises(WorkspaceRefusal) as exc:
        ws.write("new/over.bin", b"x" * 101)
    assert code(exc) == "QUOTA_EXCEEDED"
    assert not (ws.root / "new").exists()  # not even the parent directory


def test_total_quota_edges(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", max_file_bytes=1000, max_total_bytes=1000, max_entries=10)
    ws.write("a", b"x" * 600)
    ws.write("b", b"x" * 400)  # exactly at the limit
    with pytest.raises(WorkspaceRefusal) as exc:
        ws.write("c", b"x")
    assert code(exc) == "QUOTA_EXCEEDED"
    ws.write("a", b"x" * 599)  # replacing counts the old size out
    ws.write("c", b"x")


def test_entry_quota_counts_hidden_entries(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", max_entries=3)
    ws.write(".h1", b"")
    ws.write(".hidden/x", b"")  # a hidden dir and its file: 3 entries
    with pytest.raises(WorkspaceRefusal) as exc:
        ws.write(".h4", b"")
    assert code(exc) == "QUOTA_EXCEEDED" and exc.value.data["limit"] == "entries"
    assert sorted(p.name for p in ws.root.iterdir()) == [".h1", ".hidden"]


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.write("f.txt", b"old")
    with mock.patch("relay_jupyter.workspace.fsops.os.fsync", side_effect=OSError(5, "EIO")):
        with pytest.raises(OSError):
            ws.write("f.txt", b"new")
    assert ws.read("f.txt") == b"old"
    assert sorted(p.name for p in ws.root.iterdir()) == ["f.txt"]


def test_manager_one_per_conversation_and_delete(tmp_path: Path) -> None:
    m = WorkspaceManager(tmp_path / "base")
    a, b = m.for_conversation("conv/../a"), m.for_conversation("b")
    assert a is m.for_conversation("conv/../a") and a.root != b.root
    assert a.root.parent == m.base_dir and a.root.name.startswith("ws-")
    a.write("x", b"1")
    assert m.delete("conv/../a") is True and not a.root.exists()
    assert m.delete("conv/../a") is False and b.root.exists()
