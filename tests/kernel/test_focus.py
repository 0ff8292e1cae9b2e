"""Keyboard focus after a card's click (issue 13): after Connect or Approve the focus left the notebook and
Shift+Enter did nothing. A real JupyterLab in headless Chromium: after a click on Connect, and on Approve, the
focus is in the notebook (command mode) on the cell that was active before the click, and Shift+Enter moves on.
The card never takes the focus by itself (a keystroke meant for a cell must not answer a permission request)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relay_jupyter.testing import Reply, text, tool_use

from .real_server import TOKEN
from .browser_rig import ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup, lab, wait_for_idle_kernel  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

_ACTIVE_JS = """() => {
  const a = document.activeElement;
  return [a ? a.tagName.toLowerCase() : '', !!(a && a.closest('.jp-Notebook')), !!(a && a.closest('.relay-card'))];
}"""


def _active_cell(page: Any) -> int:
    return page.evaluate("() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))"
                         ".findIndex(c => c.classList.contains('jp-mod-active'))")


def test_focus_returns_to_the_notebook_after_connect_and_approve(lab: tuple[Any, Any, Any]) -> None:
    srv, fake, browser = lab
    code = ["%load_ext relay_jupyter", f"%%agent --model {MODEL}\nwrite focus.txt"]
    cells = [{"cell_type": "code", "execution_count": None, "id": f"f{i}", "metadata": {}, "outputs": [],
              "source": source} for i, source in enumerate(code)]
    # markdown cells: Shift+Enter on them moves on without waiting for the kernel (busy with the %%agent cell)
    cells += [{"cell_type": "markdown", "id": f"m{i}", "metadata": {}, "source": f"note {i}"} for i in range(3)]
    # the cell Shift+Enter runs after the Approve click: code, queued behind the %%agent cell, so it runs after it
    cells[3] = {"cell_type": "code", "execution_count": None, "id": "after", "metadata": {}, "outputs": [],
                "source": "print('RAN-AFTER-' + 'APPROVE')"}
    (srv.root / "focus.ipynb").write_text(json.dumps({
        "cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}))
    fake.enqueue(Reply(text("Writing."), tool_use("run_code", {"code": "open('focus.txt', 'w').write('ok')"})))
    fake.enqueue(Reply(text("FOCUS-DONE")))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{srv.url}lab/workspaces/focus/tree/focus.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_idle_kernel(page)
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Escape")  # command mode, as a person running cells with the keyboard is
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")  # the %%agent cell: the next cell (2) is now the active one
    connect = page.get_by_role("button", name="Connect", exact=True)
    connect.wait_for(timeout=60_000)
    assert _active_cell(page) == 2
    assert not page.evaluate(_ACTIVE_JS)[2]  # the card did not take the focus by itself
    connect.click()
    page.wait_for_timeout(300)
    tag, in_notebook, in_card = page.evaluate(_ACTIVE_JS)
    assert in_notebook and not in_card, (tag, in_notebook, in_card)
    assert _active_cell(page) == 2  # where the person was before the click, not the card's cell
    page.keyboard.press("Shift+Enter")
    assert _active_cell(page) == 3  # the keyboard acts on the notebook again
    approve = page.get_by_role("button", name="Approve", exact=True)
    approve.wait_for(timeout=60_000)
    assert not page.evaluate(_ACTIVE_JS)[2]
    approve.click()
    page.wait_for_timeout(300)
    tag, in_notebook, in_card = page.evaluate(_ACTIVE_JS)
    assert in_notebook and not in_card, (tag, in_notebook, in_card)
    assert _active_cell(page) == 3
    page.keyboard.press("Shift+Enter")
    assert _active_cell(page) == 4
    page.locator(".jp-OutputArea-output").filter(has_text="FOCUS-DONE").first.wait_for(timeout=60_000)
    # the keystroke after the click ran the next cell (not the %%agent cell again, not nothing)
    after = page.locator(".jp-Notebook .jp-Cell").nth(3)
    after.locator(".jp-OutputArea-output").filter(has_text="RAN-AFTER-APPROVE").wait_for(timeout=60_000)
    assert page.locator(".jp-OutputArea-output").filter(has_text="RAN-AFTER-APPROVE").count() == 1
    page.screenshot(path=str(ARTIFACTS / "kernel-focus.png"), full_page=True)
    assert (srv.root / "focus.txt").read_text() == "ok"
    page.context.close()
