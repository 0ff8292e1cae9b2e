"""A person in JupyterLab (headless Debian chromium, Playwright) runs ``%%agent --engine claude-code``: the card
for Claude Code's ``Bash`` call appears in the cell with the exact command, and Approve runs it (issue 17, Tests).

The stack is real: JupyterLab + the relay extension (broker on disk: the engine needs the scratch workspace), a
kernel started by the server, the REAL bundled ``claude`` CLI run by the broker, ``FakeAnthropic`` as the model
through relay's endpoint. ``browser`` and ``peer``: only inside a network namespace (``make test-claude-code``).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import Reply, text, tool_use

from .browser_rig import ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup, lab_with_fake, wait_for_idle_kernel  # noqa: F401
from .real_server import TOKEN

pytest.importorskip("claude_agent_sdk")


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


def test_the_card_for_a_claude_code_bash_call_shows_in_jupyterlab_and_approve_runs_it(tmp_path: Path) -> None:
    with lab_with_fake(tmp_path, in_memory=False, data_dir=str(tmp_path / "relay")) as (srv, fake, browser):
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
