"""The card of an outside CLI's call, clicked in a real browser (issues 13 and 20): a notebook cell runs the real
``claude`` CLI configured with relay's MCP gateway (``{base_url}relay/mcp`` and a ``jupyter relay mcp-token
--notebook`` token, what ``claude mcp add --transport http`` records); its call of a gated write tool waits for
relay's card, which appears in the side panel of JupyterLab in headless Chromium (the token has no originator
kernel: docs/mcp.md "consent"), with the tool and its arguments; nothing is written before the click, and Approve
lets the CLI's call through (the note is written, the CLI's answer ends the cell). Before, this card had only been
answered over the RPC (``tests/mcp/test_mcp_gateway_claude_cli.py``).

Real parts: JupyterLab with the extension (broker on disk), the shipped test MCP server over stdio, the CLI bundled
in the claude-agent-sdk wheel (quiet environment) talking to the shipped FakeAnthropic. ``peer``: only inside a
network namespace with loopback only (``make test-claude-code``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import Reply, text, tool_use

from kernel.browser_rig import ARTIFACTS, jp_asyncio_loop, jp_server_cleanup, lab_with_fake, open_relay_panel  # noqa: F401
from kernel.browser_rig import wait_for_idle_kernel
from kernel.real_server import TOKEN, RealServer
from runtime.claude_code_rig import ONLY_ISOLATED

claude_agent_sdk = pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.browser, pytest.mark.peer, pytest.mark.slow, ONLY_ISOLATED]

NOTEBOOK = "cli.ipynb"
TOOL = "mcp__relay__t__write_note"  # the CLI's name for relay's t__write_note (server "relay")


def _cell(url: str, secret: str, fake_url: str, home: Path) -> str:
    """The cell a person would write: the CLI with relay's gateway as its MCP server, its answer printed."""
    cli = str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")
    config = {"mcpServers": {"relay": {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {secret}"}}}}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ANTHROPIC_BASE_URL": fake_url,
           "ANTHROPIC_API_KEY": "test-key"}
    return (
        "import json, pathlib, subprocess\n"
        f"pathlib.Path({str(home / 'mcp.json')!r}).write_text(json.dumps({config!r}))\n"
        f"p = subprocess.run([{cli!r}, '-p', 'write the note', '--model', 'claude-fake-1', '--output-format', 'json',\n"
        f"                    '--max-turns', '4', '--mcp-config', {str(home / 'mcp.json')!r}, '--strict-mcp-config',\n"
        f"                    '--allowedTools', {TOOL!r}], env={env!r}, capture_output=True, text=True, timeout=300)\n"
        "print('CLI said:', json.loads(p.stdout)['result'] if p.returncode == 0 else p.stderr[-500:])")


def test_a_cli_run_from_a_cell_waits_for_the_card_and_approve_in_the_panel_lets_it_through(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    mcp_json = tmp_path / "servers.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"t": {
        "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    # the notebook's grant and the outside client's token, made at the terminal before the server starts
    env = RealServer(tmp_path).env()
    for args in (("grants", "add", f"notebook:{NOTEBOOK}", "--tools", "t__write_note", "--models", "*"),
                 ("mcp-token", "--notebook", NOTEBOOK, "--label", "claude")):
        done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    secret = next(w for line in done.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
    with lab_with_fake(tmp_path, in_memory=False, mcp_config_path=str(mcp_json)) as (srv, fake, browser):
        fake.enqueue(Reply(tool_use(TOOL, {"path": "cli.txt", "text": "approved in the panel"})),
                     Reply(text("done: the note is written")))
        cells = ["%load_ext relay_jupyter", _cell(srv.url + "relay/mcp", secret, fake.base_url, home)]
        (srv.root / NOTEBOOK).write_text(json.dumps({
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": os.urandom(4).hex(), "metadata": {}, "source": src, "outputs": [],
                       "execution_count": None} for src in cells]}))
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        try:
            page.goto(f"{srv.url}lab/workspaces/cli/tree/{NOTEBOOK}?reset&token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            panel = open_relay_panel(page)
            assert wait_for_idle_kernel(page), "the notebook's kernel never became idle"
            page.locator(".jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            page.keyboard.press("Shift+Enter")
            card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="t__write_note")
            try:
                card.first.wait_for(timeout=180_000)
            finally:
                page.screenshot(path=str(ARTIFACTS / "panel-cli-card.png"), full_page=True)
            shown: Any = card.first.inner_text()
            assert "cli.ipynb" in shown and "approved in the panel" in shown and "cli.txt" in shown, shown
            assert not (notes / "cli.txt").exists()  # nothing before the click
            assert [b.inner_text() for b in card.first.locator("button").all()][:2] == ["Approve", "Deny"]
            card.first.get_by_role("button", name="Approve", exact=True).click()
            card.first.wait_for(state="detached", timeout=30_000)
            page.locator(".jp-OutputArea-output").filter(has_text="CLI said: done: the note is written").first.wait_for(
                timeout=180_000)
            page.screenshot(path=str(ARTIFACTS / "panel-cli-card-after.png"), full_page=True)
        finally:
            page.context.close()
        assert (notes / "cli.txt").read_text() == "approved in the panel"
        audit = srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": "audit.tail",
                                              "params": {"n": 50, "tool": "t__write_note"}})["result"]["records"]
        (call,) = [r for r in audit if str(r.get("call_id") or "").startswith("mcpgw_")]
        assert call["decision"] == "allow" and call["origin"] == f"notebook:{NOTEBOOK}"
        assert str(call.get("answered_by", "")).startswith("browser:"), call  # the click in the panel
