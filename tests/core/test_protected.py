"""Protected targets: refused case-folded, before and after resolution, existing or not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths


@pytest.fixture
def rules(tmp_path: Path) -> ProtectedPaths:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "data").mkdir()
    (root / "conf").mkdir()
    return ProtectedPaths.for_jupyter(root, data_dir=tmp_path / "data", config_dirs=[root / "conf"],
                                      runtime_dir=tmp_path / "runtime")


@pytest.mark.parametrize("target", [
    ".git/config", ".GIT/hooks/pre-commit", "sub/.Git/x", "mcp.json", "a/MCP.JSON",
    ".ipynb_checkpoints/n-checkpoint.ipynb", "sub/.IPYNB_CHECKPOINTS/x", "conf/jupyter_server_config.py",
    "CONF/x.json", "../outside.txt",
])
def test_protected_targets_are_refused(rules: ProtectedPaths, target: str) -> None:
    with pytest.raises(WorkspaceRefusal) as exc:
        rules.resolve(target)
    assert exc.value.code.value == "PATH_REFUSED"


def test_plain_targets_pass_even_when_missing(rules: ProtectedPaths) -> None:
    parts, resolved = rules.resolve("notes/new.md")
    assert parts == ("notes", "new.md") and resolved == rules.root / "notes" / "new.md"


def test_symlinked_parents_count_as_where_they_point(rules: ProtectedPaths, tmp_path: Path) -> None:
    os.symlink(tmp_path / "data", rules.root / "innocent")
    os.symlink(tmp_path, rules.root / "up")
    (rules.root / "repo" / ".git").mkdir(parents=True)
    os.symlink(rules.root / "repo" / ".git", rules.root / "g")
    for target in ("innocent/relay.db", "up/elsewhere.txt", "g/config"):
        with pytest.raises(WorkspaceRefusal):
            rules.resolve(target)


def test_a_sibling_with_a_common_prefix_is_outside(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "ws-evil").mkdir()
    os.symlink(tmp_path / "ws-evil", root / "link")
    with pytest.raises(WorkspaceRefusal):
        ProtectedPaths(root).resolve("link/x")
