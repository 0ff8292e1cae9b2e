"""The side panel with hostile content, in a real browser (issue 11, the labextension's part).

Everything the panel shows that a model, a tool or a file controls — a permission request's arguments (a
``run_code`` call's code, a push's file names), the notebook a request, a grant, a run and an audit row belong
to (its path is a file name anyone can choose), reasons and refusal messages — is driven here through a real
broker (JupyterLab + the relay extension, FakeAnthropic proposing the calls, a kernel started by the server)
into the panel in headless Chromium. The panel must show each string as text: no script runs, no element or
attribute other than the panel's own, no ``javascript:``/``data:`` URL in the DOM, no request to another host.

MCP server names (``mcp/config._SERVER_NAME``) and MCP tool names (``mcp/discovery._FULL_NAME``) are plain
``[A-Za-z0-9_-]`` by the broker's own rules, so the hostile strings a panel can meet are the ones above.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .hostile_corpus import CORPUS, PWN
from .real_server import TOKEN, RealServer
from .browser_rig import (_URLS_JS, ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup,  # noqa: F401
                          lab_with_fake, open_relay_panel, wait_for_idle_kernel)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# a notebook file name is free text: it becomes the origin the panel shows on every row
NOTEBOOK = f'<img src=x onerror="{PWN}">[nb](javascript:{PWN})\u202egnp.ipynb'
# a scratch file name and a Jupyter-root target the model chooses (the workspace's rules accept both)
FILE = f"<svg onload={PWN}>[f](javascript:{PWN}).txt"
TARGET = f"<iframe src=javascript:{PWN}>.py"
CODE = "\n".join(CORPUS[:40]) + f"\n# <script>{PWN}</script> \u202e end"

# the panel builds its DOM from these tags and attributes only (labextension/src/panel.ts, el())
PANEL_TAGS = {"div", "h2", "h3", "p", "pre", "button", "table", "tbody", "tr", "th", "td", "input", "span", "progress"}
# ``hidden``: the MCP sign-in section hides itself when no server signs in with OAuth (labextension/src/mcpSignin.ts)
PANEL_ATTRS = {"class", "title", "data-request-id", "data-run-id", "data-scope", "disabled", "type", "placeholder",
               "aria-label", "max", "value", "hidden"}

_PANEL_DOM_JS = """() => {
  const panel = document.getElementById('relay-jupyter-panel');
  const tags = new Set(), attrs = new Set();
  for (const el of panel.querySelectorAll('*')) {
    tags.add(el.tagName.toLowerCase());
    for (const a of el.getAttributeNames()) attrs.add(a.toLowerCase() + ' (' + el.tagName.toLowerCase() + ')');
  }
  return [Array.from(tags), Array.from(attrs)];
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    """JupyterLab with a broker on disk (the scratch workspace exists only then) and FakeAnthropic."""
    with lab_with_fake(tmp_path_factory.mktemp("panel"), in_memory=False) as served:
        yield served


def _shown(value: str) -> str:
    """What the panel's ``visible()`` makes of a string (bidi and control characters as <U+XXXX>)."""
    return re.sub(r"[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064"
                  r"\u2066-\u2069\ufeff]", lambda m: f"<U+{ord(m.group()):04X}>", re.sub(r"\r\n?", "\n", value))


def _write_notebook(path: Path) -> None:
    cells = ["%load_ext relay_jupyter",
             f"relay.connect(['run_code', 'scratch_write', 'scratch_push'], models=[{MODEL!r}])",
             f"%%agent --model {MODEL}\nbe hostile to the side panel"]
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": source} for i, source in enumerate(cells)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


def _assert_panel_inert(page: Any, requests: list[str], dialogs: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    tags, attrs = page.evaluate(_PANEL_DOM_JS)
    assert set(tags) <= PANEL_TAGS, sorted(set(tags) - PANEL_TAGS)
    # the filter box gets a style attribute from the page itself (not from any string of the broker's)
    unexpected = sorted(a for a in attrs if a.split(" ")[0] not in PANEL_ATTRS and a != "style (input)")
    assert unexpected == [], unexpected
    for tag, attr, raw, resolved in page.evaluate(_URLS_JS):
        for value in (raw, resolved):
            scheme = value.strip().lower().split(":", 1)[0] if ":" in value else ""
            assert scheme not in ("javascript", "data", "vbscript"), (tag, attr, raw)
    remote = sorted({urlsplit(url).hostname or url for url in requests
                     if urlsplit(url).scheme in ("http", "https", "ws", "wss")} - {"127.0.0.1"})
    assert remote == [], remote


def test_hostile_strings_reach_the_panel_as_text(lab: tuple[Any, Any, Any]) -> None:
    srv, fake, browser = lab
    _write_notebook(srv.root / NOTEBOOK)
    fake.enqueue(Reply(text("writing"), tool_use("scratch_write", {"path": FILE, "content": CODE})))
    fake.enqueue(Reply(tool_use("scratch_push", {"path": FILE, "target": TARGET})))
    fake.enqueue(Reply(tool_use("run_code", {"code": CODE})))
    fake.enqueue(Reply(text("PANEL-END-MARK")))
    requests: list[str] = []
    dialogs: list[str] = []
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.on("request", lambda request: requests.append(request.url))
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(f"{srv.url}lab/workspaces/hostile-panel/tree/{quote(NOTEBOOK)}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    panel = open_relay_panel(page)
    wait_for_idle_kernel(page)
    page.locator(".jp-Cell").first.click()
    for _ in range(3):
        page.keyboard.press("Shift+Enter")
    origin = _shown(f"notebook:{NOTEBOOK}")

    # 1. the push: its file names in the arguments, the notebook as its origin
    push = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push")
    try:
        push.first.wait_for(timeout=90_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "panel-hostile-push.png"), full_page=True)
    page.screenshot(path=str(ARTIFACTS / "panel-hostile-push.png"), full_page=True)
    shown = push.first.inner_text()
    assert origin in shown, shown
    assert json.dumps(FILE)[1:-1] in shown and json.dumps(TARGET)[1:-1] in shown, shown
    _assert_panel_inert(page, requests, dialogs)
    # the panel offers the scopes the broker offers: all of them for a push
    assert [b.inner_text() for b in push.first.locator("button").all()] == [
        "Approve", "Deny", "Allow for this run", "Always allow for this notebook"]
    push.first.get_by_role("button", name="Deny").click()
    push.first.wait_for(state="detached", timeout=30_000)

    # 2. run_code: the exact code as text, every payload of the corpus in it, the bidi override shown
    card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="run_code")
    card.first.wait_for(timeout=90_000)
    code = card.first.locator(".jp-relay-code").inner_text()
    assert code == _shown(CODE), code[:400]
    assert "<U+202E>" in code and f"<script>{PWN}</script>" in code
    page.screenshot(path=str(ARTIFACTS / "panel-hostile-run-code.png"), full_page=True)
    _assert_panel_inert(page, requests, dialogs)
    # run_code is approved one call at a time: no wider scope is offered in the panel either
    assert [b.inner_text() for b in card.first.locator("button").all()] == ["Approve", "Deny"]
    card.first.get_by_role("button", name="Deny").click()
    card.first.wait_for(state="detached", timeout=30_000)

    # 3. after the run: the grant, the run and the audit rows all name the hostile notebook, as text
    page.locator(".jp-OutputArea-output").filter(has_text="PANEL-END-MARK").first.wait_for(timeout=90_000)
    panel.get_by_role("button", name="Refresh").click()
    nb_shown = _shown(NOTEBOOK)
    grant = panel.locator(".jp-relay-grants .jp-relay-grant").filter(has_text="gnp.ipynb").first
    grant.wait_for(timeout=30_000)
    assert origin in grant.inner_text()
    # the budget meters: tokens and cost against the grant's day limits (numbers only)
    meters = grant.locator("progress.jp-relay-meter")
    assert meters.count() == 2
    assert [meters.nth(i).get_attribute("max") for i in range(2)] == ["200000", "5"]
    assert float(meters.nth(0).get_attribute("value") or "0") > 0
    run = panel.locator(".jp-relay-runs .jp-relay-run").filter(has_text="gnp.ipynb").first
    run.wait_for(timeout=30_000)
    assert run.locator(".jp-relay-notebook").inner_text() == nb_shown
    assert run.locator(".jp-relay-notebook").get_attribute("title") == origin  # the tooltip too: no bidi override
    rows = panel.locator(".jp-relay-audit .jp-relay-audit-row").filter(has_text="run_code")
    rows.first.wait_for(timeout=30_000)
    assert rows.first.locator(".jp-relay-notebook").inner_text() == nb_shown
    assert "deny" in rows.first.inner_text()
    page.screenshot(path=str(ARTIFACTS / "panel-hostile-after.png"), full_page=True)
    _assert_panel_inert(page, requests, dialogs)
    # clicking every piece of hostile text in the panel runs nothing either
    for node in panel.locator("td, pre, .jp-relay-card-title").all():
        if node.is_visible():
            node.click(force=True)
    page.wait_for_timeout(500)
    _assert_panel_inert(page, requests, dialogs)
    assert not (srv.root / TARGET).exists()
    # the checks can fail: the same string inserted as HTML (what an innerHTML would do) is caught
    page.evaluate("s => document.querySelector('#relay-jupyter-panel .jp-relay-grant').insertAdjacentHTML("
                  "'beforeend', s)", f'<a href="javascript:{PWN}">x</a><img src=x onerror="{PWN}">')
    page.wait_for_timeout(500)
    with pytest.raises(AssertionError):
        _assert_panel_inert(page, requests, dialogs)
    page.context.close()
