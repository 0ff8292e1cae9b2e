"""Attack: text printed by ``jupyter relay tools list`` obeyed by the user's terminal.

The listing prints MCP servers' names, states, errors, skipped-tool lines and the command line from
``mcp.json`` (a project's config may come from a cloned repository). A terminal escape in any of them
(clear the screen, retitle the window, move the cursor over the line that says ``write``) or a bidi
override would rewrite what the user reads. Every such character is printed as ``<U+XXXX>``
(``core/visible.py``, shared with the notebook renderer).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from daemon_harness import run_cli

from relay_jupyter.core.visible import visible

pytestmark = pytest.mark.slow

HOSTILE = "x\x1b[2J\x1b]0;owned\x07\r\u202eevil\x9b"


def test_the_listing_prints_no_control_character(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "mcp.json").write_text(json.dumps({"mcpServers": {"e": {
        "command": sys.executable, "args": ["-c", "import sys; sys.exit(3)", HOSTILE]}}}))
    listed = run_cli(tmp_path, "tools", "list")
    assert listed.returncode == 0, listed.stderr
    assert "<U+001B>[2J" in listed.stdout and "<U+202E>evil" in listed.stdout, listed.stdout
    shown = listed.stdout.replace("\n", "")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u202a\u202b\u202c\u202d\u202e"
                   for c in shown), repr(listed.stdout)


@pytest.mark.parametrize("raw", ["\x1b[31mred", "a\rb", "\u2066iso\u2069", "\x00nul", "tab\there", "line\nbreak"])
def test_visible_marks_each_control(raw: str) -> None:
    out = visible(raw, newlines=False)
    assert "<U+" in out
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x2066 <= ord(c) <= 0x2069 for c in out)
