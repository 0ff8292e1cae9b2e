"""A URL-mode elicitation card clicked in a real browser (issue 13 follow-up: the card had only been built with
ipywidgets outside a kernel, never clicked in JupyterLab).

Real parts: JupyterLab + the relay extension (broker, runtime), FakeAnthropic as the model, headless Debian
chromium, and ``tests/mcp/raw_mcp_server.py`` (stdio, protocol 2025-11-25) configured in mcp.json: its ``ask``
tool sends ``elicitation/create`` in URL mode (a payment page). A person runs the ``%%agent`` cell, connects,
sees the card in the cell with the page's host and a link that opens only on their click (a new tab, noopener
noreferrer), clicks "I opened it", and the run goes on: the MCP server got ``accept`` and nothing else.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .browser_rig import (  # noqa: F401 - the rig's fixtures
    ARTIFACTS,
    MODEL,
    jp_asyncio_loop,
    jp_server_cleanup,
    lab_with_fake,
    wait_for_idle_kernel,
)
from .real_server import TOKEN, RealServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RAW_SERVER = Path(__file__).resolve().parents[1] / "mcp" / "raw_mcp_server.py"
STATE = "state-7c1e"
PAGE = f"https://pay.example.com/checkout?session={STATE}"


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    tmp = tmp_path_factory.mktemp("elicit-url")
    spec = tmp / "elicit.json"
    spec.write_text(json.dumps({"mode": "url", "message": "Finish the payment on the shop's page", "url": PAGE,
                                "elicitationId": "el-1"}))
    mcp_json = tmp / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"shop": {
        "command": sys.executable, "args": [str(RAW_SERVER), "--version", "2025-11-25", "--elicit", str(spec)]}}}))
    with lab_with_fake(tmp, mcp_config_path=str(mcp_json)) as served:
        yield served


def _notebook(path: Path, agent_cell: str) -> None:
    def cell(source: str) -> dict[str, Any]:
        return {"cell_type": "code", "execution_count": None, "id": os.urandom(4).hex(), "metadata": {},
                "outputs": [], "source": source}

    path.write_text(json.dumps({
        "cells": [cell("%load_ext relay_jupyter"), cell(agent_cell)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


def _tools(srv: RealServer) -> list[str]:
    reply = srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": "tools.list",
                                          "params": {"origin": "notebook:pay.ipynb"}})
    return [t.get("name") for t in (reply.get("result") or {}).get("tools", [])]


def test_the_url_card_is_clicked_in_the_browser_and_accept_means_opened(
        shop: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, browser = shop
    for _ in range(300):  # the MCP server connects in the background after the server starts
        if "shop__ask" in _tools(srv):
            break
        time.sleep(0.1)
    assert "shop__ask" in _tools(srv), _tools(srv)
    _notebook(srv.root / "pay.ipynb", f"%%agent --mode full --model {MODEL}\npay for my order")
    fake.enqueue(Reply(text("Asking the shop."), tool_use("shop__ask", {})), Reply(text("Payment done.")))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    opened: list[str] = []
    page.context.on("page", lambda p: opened.append(p.url))  # a tab relay opened by itself would show here
    page.goto(f"{srv.url}lab/workspaces/pay/tree/pay.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    assert wait_for_idle_kernel(page)
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    page.get_by_role("button", name="Connect", exact=True).click(timeout=60_000)

    accept = page.get_by_role("button", name="I opened it", exact=True)
    try:
        accept.wait_for(timeout=60_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "kernel-elicitation-url-card.png"), full_page=True)
    card = page.locator(".jp-OutputArea-output").filter(has=accept).first
    shown = card.inner_text()
    assert "pay.example.com" in shown and "relay does not open it" in shown, shown
    assert "Finish the payment on the shop's page" in shown, shown
    link = card.locator(f'a[href="{PAGE}"]')
    assert link.count() == 1, card.inner_html()
    assert link.get_attribute("target") == "_blank", link.evaluate("a => a.outerHTML")
    assert set((link.get_attribute("rel") or "").split()) >= {"noopener", "noreferrer"}
    assert opened == []  # shown, never opened: only the person's click would open it
    assert [b.inner_text() for b in card.get_by_role("button").all()] == ["I opened it", "Decline", "Cancel"]

    # the person's click opens the page in a new tab (answered here: no request leaves the machine) and the
    # notebook stays where it was (before target=_blank the click replaced JupyterLab with the shop's page)
    page.context.route("https://pay.example.com/**", lambda route: route.fulfill(body="the shop's page"))
    lab_url = page.url
    with page.expect_popup() as popup:
        link.click()
    assert popup.value.url == PAGE and page.url == lab_url and opened == [PAGE], (popup.value.url, page.url)
    popup.value.close()

    accept.click()
    page.get_by_text("Payment done.").wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "kernel-elicitation-url-after.png"), full_page=True)
    assert accept.is_disabled()
    assert opened == [PAGE]
    # the MCP server's tool answered with the client's reply: accept, no content (in URL mode nothing typed
    # goes back through relay); the model saw that as the tool result
    last = fake.requests[-1].body["messages"][-1]
    results = [b for b in last["content"] if b.get("type") == "tool_result"]
    assert len(results) == 1, last
    result = json.dumps(results[0]["content"])
    assert json.dumps('[{"action": "accept"}]')[1:-1] in result, result
    audit = srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 2, "method": "audit.tail", "params": {"n": 50}})
    records = [r for r in audit["result"]["records"] if str(r.get("tool", "")).startswith("elicitation:")]
    assert [(r["decision"], r["arguments"].get("mode"), r["arguments"].get("url_host")) for r in records] == [
        ("accept", "url", "pay.example.com")], records
    assert STATE not in json.dumps(audit)  # the audit keeps the host, not the page's session
    page.context.close()
