"""Secrets on an MCP server's command line are masked in every listing (issue 19 item 5): ``jupyter relay
tools list`` (text and JSON) and the registry's status, while the exact command line stays bound into the
tool digests. The server really connects with its real arguments."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.cli import main
from relay_jupyter.core.redact import MASK, mask_argv

GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
SK = "sk-ant-api03-" + "x" * 40


@pytest.mark.parametrize(("argv", "hidden"), [
    (["srv", "--token", "plain-word-secret"], "plain-word-secret"),
    (["srv", "--api-key=hunter2hunter2"], "hunter2hunter2"),
    (["srv", "--auth-token", "abc123"], "abc123"),
    (["docker", "run", "-e", f"GITHUB_PERSONAL_ACCESS_TOKEN={GH}", "img"], GH),
    (["env", "API_KEY=opensesame", "srv"], "opensesame"),
    (["srv", SK], SK),
    (["srv", "--url", "https://user:pa55word@db.example.com/x"], "pa55word"),
    (["srv", "--password", "p@ss w0rd"], "p@ss w0rd"),
])
def test_secret_arguments_are_masked(argv: list[str], hidden: str) -> None:
    shown = mask_argv(argv)
    assert len(shown) == len(argv) and hidden not in " ".join(shown) and MASK in " ".join(shown)


def test_ordinary_arguments_stay() -> None:
    argv = [sys.executable, "-m", "mcp_server_git", "--repository", "/home/me/repo", "--max-tokens", "500",
            "--verbose"]
    assert mask_argv(argv) == argv  # counts (max-tokens) are not secrets


def test_tools_list_masks_a_token_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       notes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    # a token handed to the server on its command line, the way `docker run -e NAME=token` configs do
    (config / "mcp.json").write_text(json.dumps({"mcpServers": {"t": {
        "command": "/usr/bin/env",
        "args": [f"API_TOKEN={GH}", sys.executable, "-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    assert main(["tools", "list"]) == 0
    text = capsys.readouterr().out
    assert main(["tools", "list", "--json"]) == 0
    listing = capsys.readouterr().out
    assert GH not in text + listing
    status = {s["name"]: s for s in json.loads(listing)["servers"]}["t"]
    assert status["state"] == "connected", status  # it connected with its real argument
    assert f"API_TOKEN={MASK}" in status["source"] and "mcp_server" in status["source"]


def test_a_changed_tool_card_masks_the_command_line_token() -> None:
    from relay_jupyter.core.types import ToolClass, ToolSpec
    from relay_jupyter.runtime.tools import tool_change

    source = f"/usr/bin/env API_TOKEN={GH} python -m server"
    old = ToolSpec(name="s__t", server="s", source=source, tool_class=ToolClass.READ)
    new = old.model_copy(update={"description": "now destructive"})
    change = tool_change(old, new)
    assert GH not in json.dumps(change) and f"API_TOKEN={MASK}" in change["new"]["source"]
