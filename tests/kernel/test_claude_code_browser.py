"""The ``claude`` CLI's cards clicked by a person in JupyterLab (headless Debian chromium, Playwright):

- ``%%agent --engine claude-code``: the card for Claude Code's ``Bash`` call appears in the cell with the exact
  command, and Approve runs it (issue 17, Tests).
- The CLI as an *outside* MCP client, run from a notebook cell with relay's MCP gateway (``{base_url}relay/mcp`` and
  a ``jupyter relay mcp-token --notebook`` token, what ``claude mcp add --transport http`` records): its call of a
  gated write tool waits for relay's card, which appears in the side panel (the token has no originator kernel:
  docs/mcp.md "consent") with the notebook, tool and arguments; nothing is written before the click, and Approve
  lets the call through (issue 20, Tests: "the card approved in a real JupyterLab"; before, that card was answered
  only over the RPC, ``tests/mcp/test_mcp_gateway_claude_cli.py``).

The stack is real: one JupyterLab + the relay extension for the module (broker on disk: the engine needs the
scratch workspace; the shipped test MCP server over stdio in its mcp.json), kernels started by the server, the REAL
bundled ``claude`` CLI (quiet environment), ``FakeAnthropic`` as the model. ``browser`` and ``peer``: only inside a
network namespace (``make test-claude-code``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import Reply, text, tool_use

from .browser_rig import ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup, lab_with_fake, wait_for_idle_kernel  # noqa: F401
from .browser_rig import open_relay_panel
from .real_server import TOKEN, RealServer

claude_agent_sdk = pytest.importorskip("claude_agent_sdk")


def _isolated() -> bool:
    """True inside a network namespace with only loopback (``unshare -n``): no route out."""
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
        ifaces = {line.split()[0].rstrip(":") for line in Path("/proc/net/dev").read_text().splitlines()[2:]
                  if line.strip()}
    except OSError:
        return False
    return not routes and ifaces <= {"lo"}


pytestmark = [pytest.mark.browser, pytest.mark.peer, pytest.mark.slow,
              pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")]


def _notebook(path: Path, *sources: str) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": os.urandom(4).hex(), "metadata": {}, "outputs": [],
              "source": source} for source in sources]
    path.write_text(json.dumps({
        "cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


CLI_NOTEBOOK = "cli.ipynb"
CLI_TOOL = "mcp__relay__t__write_note"  # the CLI's name for relay's t__write_note (server "relay")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One JupyterLab (broker on disk, the test MCP server ``t``), FakeAnthropic and a browser for the module; the
    grant of ``cli.ipynb`` and an outside client's gateway token for it, made at the terminal before the start."""
    tmp = tmp_path_factory.mktemp("cc-browser")
    notes = tmp / "notes"
    notes.mkdir()
    mcp_json = tmp / "servers.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"t": {
        "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    env = RealServer(tmp).env()  # the environment lab_with_fake's server gets: the same data dir
    for args in (("grants", "add", f"notebook:{CLI_NOTEBOOK}", "--tools", "t__write_note", "--models", "*"),
                 ("mcp-token", "--notebook", CLI_NOTEBOOK, "--label", "claude")):
        done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    secret = next(w for line in done.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
    with lab_with_fake(tmp, in_memory=False, mcp_config_path=str(mcp_json)) as (srv, fake, browser):
        yield {"srv": srv, "fake": fake, "browser": browser, "tmp": tmp, "notes": notes, "secret": secret}


def test_the_card_for_a_claude_code_bash_call_shows_in_jupyterlab_and_approve_runs_it(lab: dict[str, Any]) -> None:
    srv, fake, browser, tmp_path = lab["srv"], lab["fake"], lab["browser"], lab["tmp"]
    marker = tmp_path / f"approved-{secrets.token_hex(4)}.txt"
    command = f"echo approved > {marker}"
    fake.enqueue(Reply(text("I will run one command."), tool_use("Bash", {"command": command,
                                                                           "description": "write the marker"})),
                 Reply("Finished after the command."))
    _notebook(srv.root / "cc.ipynb", "%load_ext relay_jupyter", "relay.connect(['*'])",
              f"%%agent --engine claude-code --model {MODEL}\nwrite the marker")
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    try:
        page.goto(f"{srv.url}lab/workspaces/cc/tree/cc.ipynb?reset&token={TOKEN}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        assert wait_for_idle_kernel(page), "the notebook's kernel never became idle"
        page.locator(".jp-Cell").first.click()
        for _ in range(3):
            page.keyboard.press("Shift+Enter")
        approve = page.get_by_role("button", name="Approve", exact=True)
        try:
            approve.wait_for(timeout=120_000)
        finally:
            page.screenshot(path=str(ARTIFACTS / "claude-code-bash-card.png"), full_page=True)
        card = page.locator(".jp-OutputArea-output").filter(has=approve).first
        assert "Bash" in card.inner_text() and command in card.inner_text()  # the exact command, as text
        assert not marker.exists()  # nothing ran before the click
        approve.click()
        page.get_by_text("Finished after the command.").wait_for(timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "claude-code-bash-after.png"), full_page=True)
        assert marker.read_text().strip() == "approved"
        assert page.get_by_text("Approved by you (click)").count() >= 1
    finally:
        page.context.close()


def _cli_cell(url: str, secret: str, fake_url: str, home: Path) -> str:
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
        f"p = subprocess.run([{cli!r}, '-p', 'write the note', '--model', {MODEL!r}, '--output-format', 'json',\n"
        f"                    '--max-turns', '4', '--mcp-config', {str(home / 'mcp.json')!r}, '--strict-mcp-config',\n"
        f"                    '--allowedTools', {CLI_TOOL!r}], env={env!r}, capture_output=True, text=True,\n"
        "                   timeout=300)\n"
        "print('CLI said:', json.loads(p.stdout)['result'] if p.returncode == 0 else p.stderr[-500:])")


def test_a_cli_run_from_a_cell_waits_for_the_gateway_card_and_approve_in_the_panel_lets_it_through(
        lab: dict[str, Any]) -> None:
    srv, fake, browser, notes = lab["srv"], lab["fake"], lab["browser"], lab["notes"]
    home = lab["tmp"] / "home"
    home.mkdir()
    fake.enqueue(Reply(tool_use(CLI_TOOL, {"path": "cli.txt", "text": "approved in the panel"})),
                 Reply(text("done: the note is written")))
    _notebook(srv.root / CLI_NOTEBOOK, "%load_ext relay_jupyter",
              _cli_cell(srv.url + "relay/mcp", lab["secret"], fake.base_url, home))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    try:
        page.goto(f"{srv.url}lab/workspaces/cli/tree/{CLI_NOTEBOOK}?reset&token={TOKEN}")
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
        shown = card.first.inner_text()
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
    assert call["decision"] == "allow" and call["origin"] == f"notebook:{CLI_NOTEBOOK}"
    assert str(call.get("answered_by", "")).startswith("browser:"), call  # the click in the panel
