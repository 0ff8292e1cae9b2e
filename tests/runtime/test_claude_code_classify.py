"""How the claude-code engine classifies Claude Code's built-ins (no CLI needed: the classifier is pure), and
its one-line refusals when a piece is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.core.types import ToolClass
from relay_jupyter.engines.claude_code import ClaudeCodeEngine, classify
from relay_jupyter.engines.registry import EngineServices
from relay_jupyter.runtime.manager import RunParams


@pytest.fixture
def places(tmp_path):
    root = tmp_path / "root"
    ws = tmp_path / "relay" / "ws-1"
    for d in (root / "data", root / ".ssh", ws):
        d.mkdir(parents=True)
    (root / "data" / "x.csv").write_text("a\n")
    (root / ".ssh" / "id_rsa").write_text("k")
    os.symlink(root / ".ssh" / "id_rsa", ws / "innocent.txt")
    return root, ws, ProtectedPaths(root)


def c(name, args, places):
    root, ws, protected = places
    return classify(name, args, ws, jupyter_root=root, protected=protected)


def test_reads(places):
    root, ws, _ = places
    assert c("Read", {"file_path": str(ws / "a.txt")}, places).tool_class is ToolClass.READ
    assert c("Read", {"file_path": "a.txt"}, places).tool_class is ToolClass.READ  # relative to the workspace
    assert c("Glob", {"pattern": "**/*.py"}, places).tool_class is ToolClass.READ
    assert c("Grep", {"pattern": "x", "path": str(ws)}, places).tool_class is ToolClass.READ
    # elsewhere in the Jupyter root: a card naming the path
    v = c("Read", {"file_path": str(root / "data" / "x.csv")}, places)
    assert v.tool_class is ToolClass.WRITE and str(root / "data" / "x.csv") in v.reasons[0]
    # credentials, a symlink from the workspace to one, outside the root, ~ and traversal patterns
    for args in ({"file_path": str(root / ".ssh" / "id_rsa")}, {"file_path": str(ws / "innocent.txt")}):
        v = c("Read", args, places)
        assert v.tool_class is None and "credential" in v.refusal, args
    assert c("Read", {"file_path": "/etc/passwd"}, places).tool_class is None
    assert c("Read", {"file_path": "~/.ssh/id_rsa"}, places).tool_class is None
    assert c("Read", {}, places).tool_class is None
    assert c("Grep", {"pattern": "x", "path": "/"}, places).tool_class is None
    assert c("Glob", {"pattern": "/etc/**"}, places).tool_class is ToolClass.WRITE
    assert c("Glob", {"pattern": "../../**"}, places).tool_class is ToolClass.WRITE


def test_writes_only_in_the_workspace(places):
    root, ws, _ = places
    for name, key in (("Write", "file_path"), ("Edit", "file_path"), ("NotebookEdit", "notebook_path")):
        assert c(name, {key: str(ws / "n.ipynb")}, places).tool_class is ToolClass.CONTAINED
        for target in (str(root / "n.ipynb"), "/tmp/x", str(ws / ".." / "x"), str(ws), str(ws / "innocent.txt")):
            v = c(name, {key: target}, places)
            assert v.tool_class is None and "outside the scratch workspace" in v.refusal, (name, target)


def test_commands_urls_and_unknown_tools_are_writes_with_what_they_do_on_the_card(places):
    v = c("Bash", {"command": "rm -rf ~/project"}, places)
    assert v.tool_class is ToolClass.WRITE and "rm -rf ~/project" in v.reasons[0]
    assert v.preview == {"command": "rm -rf ~/project"}
    assert c("WebFetch", {"url": "https://example.com/x"}, places).preview == {"url": "https://example.com/x"}
    assert c("WebSearch", {"query": "q"}, places).tool_class is ToolClass.WRITE
    v = c("mcp__x__y", {"a": 1}, places)
    assert v.tool_class is ToolClass.WRITE and "does not classify" in v.reasons[0]


def test_check_refuses_in_one_line_without_workspace_or_endpoint(monkeypatch):
    params = RunParams(prompt="p", model="claude-sonnet-4-5", engine="claude-code")
    engine = ClaudeCodeEngine(EngineServices())
    with pytest.raises(Exception) as info:
        engine.check(params)
    assert "\n" not in info.value.message
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "claude_agent_sdk" else real(name, *a))
    with pytest.raises(Exception) as info:
        engine.check(params)
    assert "pip install 'relay-jupyter[claude-code]'" in info.value.message and "\n" not in info.value.message


def test_reads_outside_the_workspace_follow_the_read_scope_of_scratch_pull(places, tmp_path):
    """Issue 17 item 3: credentials refused anywhere; outside the Jupyter root refused; under the origin's read
    roots (c.RelayApp.read_roots) a read; elsewhere in the root a write whose card names the path."""
    from relay_jupyter.core.protected import ReadRoots

    root, ws, protected = places
    (root / "nb").mkdir()
    (root / "nb" / "sales.csv").write_text("q,v\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("k")
    (home / "notes.txt").write_text("n")
    (ws / ".env").write_text("TOKEN=x")

    def v(name, args, origin="notebook:nb/a.ipynb", roots=("{notebook_dir}",)):
        return classify(name, args, ws, jupyter_root=root, protected=protected, read_roots=ReadRoots(roots),
                        origin=origin)

    assert v("Read", {"file_path": str(root / "nb" / "sales.csv")}).tool_class is ToolClass.READ  # its own dir
    card = v("Read", {"file_path": str(root / "data" / "x.csv")})
    assert card.tool_class is ToolClass.WRITE and str(root / "data" / "x.csv") in card.reasons[0]
    assert "read roots (nb/)" in card.reasons[0] and "model provider" in card.reasons[0]
    assert v("Read", {"file_path": str(root / "data" / "x.csv")}, roots=("data",)).tool_class is ToolClass.READ
    assert v("Read", {"file_path": str(root / "nb" / "sales.csv")}, origin="daemon:x").tool_class is ToolClass.WRITE
    assert v("Glob", {"pattern": "*.csv", "path": str(root / "nb")}).tool_class is ToolClass.READ
    assert v("Glob", {"pattern": "*.csv", "path": str(root)}).tool_class is ToolClass.WRITE  # the root: names only
    assert v("Grep", {"pattern": "q", "path": str(root / "nb")}).tool_class is ToolClass.READ
    # a search of a directory that holds a credential store would read it: refused, whatever the roots
    grep = v("Grep", {"pattern": "PRIVATE", "path": str(root)}, roots=(".",))
    assert grep.tool_class is None and ".ssh" in grep.refusal
    # the user's own credentials outside the root, ~ paths, and a credential even inside the workspace
    for args in ({"file_path": str(home / ".ssh" / "id_rsa")}, {"file_path": str(ws / ".env")}):
        refused = v("Read", args, roots=(".",))
        assert refused.tool_class is None and "credential" in refused.refusal, args
    tilde = v("Read", {"file_path": "~/.ssh/id_rsa"})
    assert tilde.tool_class is None and "no ~" in tilde.refusal
    outside = v("Read", {"file_path": str(home / "notes.txt")}, roots=(".",))
    assert outside.tool_class is None and "outside the Jupyter root" in outside.refusal
