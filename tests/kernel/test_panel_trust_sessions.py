"""The side panel's "Always allow" and model-sessions views, in a real JupyterLab in headless Chromium.

- **Always allow** (issue 11 item 6, issue 13): a person clicks "Always allow for this notebook" on a write tool's
  card in the cell (``propose_cell``); a later run's call to the same tool goes through without a card; the
  panel's grant shows the saved trust (and Forget removes it); a ``run_code`` card offers Approve and Deny only,
  in the cell and in the panel.
- **Requests per session** (issue 16 item 4): SDK requests from a kernel through ``relay/anthropic`` under one
  ``x-relay-session`` show in the panel's "Model sessions" as one row with their count, tokens, cost and
  lineage, equal to what ``relay.telemetry()`` says.

The stack is real: JupyterLab + the relay extension (broker, runtime), FakeAnthropic as the model, kernels
started by the server. One server and one browser for the module (about 60 s in all).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from relay_jupyter.testing import Reply, text, tool_use
from relay_jupyter.testing.script import Usage

from .conftest import execute, text_of
from .real_server import TOKEN, RealServer
from .browser_rig import ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup, lab, open_relay_panel, wait_for_idle_kernel  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _notebook(srv: RealServer, name: str, sources: list[str]) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": source} for i, source in enumerate(sources)]
    (srv.root / name).write_text(json.dumps({
        "cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}))


def _open(srv: RealServer, browser: Any, name: str) -> tuple[Any, Any]:
    """``name`` opened in a fresh context with the relay panel showing; returns (page, panel)."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(f"{srv.url}lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_idle_kernel(page)
    return page, open_relay_panel(page)


def _run_cell(page: Any, marker: str) -> None:
    """Run the cell whose source contains ``marker`` (cells are found by text: a proposed cell shifts them)."""
    page.locator(".jp-Notebook .jp-Cell").filter(has=page.locator(".jp-InputArea", has_text=marker)).first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")


def _output_of(page: Any, marker: str) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").filter(
        has=page.locator(".jp-InputArea", has_text=marker)).first.locator(".jp-OutputArea")


def test_always_allow_lets_a_later_call_through_and_is_not_offered_for_run_code(
        lab: tuple[RealServer, Any, Any]) -> None:
    srv, fake, browser = lab
    _notebook(srv, "always.ipynb", [
        "%load_ext relay_jupyter",
        f"%%agent --model {MODEL}\nFIRST: propose a cell",
        f"%%agent --model {MODEL}\nSECOND: propose another",
        f"%%agent --model {MODEL}\nTHIRD: run some code",
    ])
    fake.enqueue(Reply(text("Proposing."), tool_use("propose_cell", {"code": "first_proposal = 1"})),
                 Reply(text("FIRST-DONE")),
                 Reply(text("Proposing again."), tool_use("propose_cell", {"code": "second_proposal = 2"})),
                 Reply(text("SECOND-DONE")),
                 Reply(text("Running."), tool_use("run_code", {"code": "open('ran.txt', 'w').write('x')"})),
                 Reply(text("THIRD-DONE")))
    page, panel = _open(srv, browser, "always.ipynb")
    _run_cell(page, "%load_ext relay_jupyter")
    page.locator(".jp-InputPrompt").filter(has_text="[1]").first.wait_for(timeout=60_000)

    _run_cell(page, "FIRST: propose a cell")
    first = _output_of(page, "FIRST: propose a cell")
    first.get_by_role("button", name="Connect", exact=True).click(timeout=60_000)
    always = first.get_by_role("button", name="Always allow for this notebook", exact=True)
    always.wait_for(timeout=60_000)
    assert [b.inner_text() for b in first.locator(".relay-card button").all()][-4:] == [
        "Approve", "Deny", "Allow for this run", "Always allow for this notebook"]
    always.click()
    first.get_by_text("FIRST-DONE").wait_for(timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").filter(has_text="first_proposal = 1").first.wait_for(timeout=30_000)

    # the panel's grant shows the saved answer (a grant.changed / run.done refresh brought it)
    trust = panel.locator(".jp-relay-grant").filter(has_text="always.ipynb").locator(".jp-relay-trust-row")
    trust.filter(has_text="always allowed: propose_cell").wait_for(timeout=30_000)

    # a later run's call to the same tool: no card, the proposal lands, the run ends
    _run_cell(page, "SECOND: propose another")
    second = _output_of(page, "SECOND: propose another")
    second.get_by_text("SECOND-DONE").wait_for(timeout=60_000)
    assert second.locator("button").count() == 0, second.inner_text()
    page.locator(".jp-Notebook .jp-Cell").filter(has_text="second_proposal = 2").first.wait_for(timeout=30_000)
    assert not panel.locator(".jp-relay-approvals .jp-relay-card").count()
    rows = panel.locator(".jp-relay-audit .jp-relay-audit-row").filter(has_text="propose_cell")
    rows.filter(has_text="allow").nth(1).wait_for(timeout=30_000)  # both calls allowed, the second by the trust

    # run_code: Approve and Deny only, in the cell and in the panel; a Deny from the panel leaves no file
    _run_cell(page, "THIRD: run some code")
    third = _output_of(page, "THIRD: run some code")
    third.get_by_role("button", name="Approve", exact=True).wait_for(timeout=60_000)
    assert [b.inner_text() for b in third.locator(".relay-card button").all()] == ["Approve", "Deny"]
    card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="run_code").first
    card.wait_for(timeout=30_000)
    assert [b.inner_text() for b in card.locator("button").all()] == ["Approve", "Deny"]
    page.screenshot(path=str(ARTIFACTS / "panel-always-allow.png"), full_page=True)
    card.get_by_role("button", name="Deny").click()
    third.get_by_text("THIRD-DONE").wait_for(timeout=60_000)
    assert not (srv.root / "ran.txt").exists()
    # the trust of propose_cell did not spill over to run_code, and it stays until the person forgets it
    assert trust.count() == 1, [t.inner_text() for t in trust.all()]
    trust.first.get_by_role("button", name="Forget").click()
    trust.first.wait_for(state="detached", timeout=30_000)
    page.context.close()


def test_the_panel_shows_requests_per_session(lab: tuple[RealServer, Any, Any]) -> None:
    srv, fake, browser = lab
    _notebook(srv, "sdk.ipynb", ["# the requests are made from the test's own client of this notebook's kernel"])
    kc = srv.kernel_for("sdk.ipynb")
    fake.enqueue(Reply(text("one"), usage=Usage(input_tokens=6, output_tokens=2)),
                 Reply(text("two"), usage=Usage(input_tokens=9, output_tokens=3)),
                 Reply(text("three"), usage=Usage(input_tokens=7, output_tokens=1)))
    code = ("%load_ext relay_jupyter\n"
            "%config AgentMagics.consent_ui = 'headless'\n"
            f"relay.connect([], models=[{MODEL!r}])\n"
            "c = relay.anthropic(max_retries=0, default_headers={'x-relay-session': 'panel-s1'})\n"
            f"ask = lambda h: c.messages.create(model={MODEL!r}, max_tokens=16, messages=h).content[0].text\n"
            "h = [{'role': 'user', 'content': 'hello'}]\n"
            "a = ask(h)\n"
            "h += [{'role': 'assistant', 'content': a}, {'role': 'user', 'content': 'more'}]\n"
            "ask(h)\n"
            "ask([h[0], {'role': 'assistant', 'content': 'edited'}, {'role': 'user', 'content': 'again'}])\n"
            "df = relay.telemetry()\n"
            "s = df[df['session'] == 'panel-s1']\n"
            "print('ROWS', len(s), int(s['tokens'].sum()), f\"{s['cost_usd'].sum():.4f}\","
            " ' '.join(s['lineage']))")
    reply, msgs = execute(kc, code, timeout=120)
    out = text_of(msgs)
    assert reply["status"] == "ok", out
    found = re.search(r"ROWS (\d+) (\d+) (\S+) (.+)", out)
    assert found, out
    assert found.group(1) == "3" and found.group(4).split() == ["new", "continuation", "undo"], out
    tokens, cost = int(found.group(2)), found.group(3)
    assert tokens == 6 + 2 + 9 + 3 + 7 + 1

    page, panel = _open(srv, browser, "sdk.ipynb")
    row = panel.locator(".jp-relay-sessions .jp-relay-session").filter(has_text="panel-s1")
    row.wait_for(timeout=30_000)  # taken with the panel's first snapshot
    assert row.count() == 1
    assert row.locator(".jp-relay-notebook").inner_text() == "sdk.ipynb"
    assert row.locator(".jp-relay-session-requests").inner_text() == "3"
    assert row.locator(".jp-relay-session-tokens").inner_text() == f"{tokens:,}"
    assert row.locator(".jp-relay-session-cost").inner_text() == f"${cost}"
    assert row.locator(".jp-relay-session-lineage").inner_text() == "new 1 · continuation 1 · undo 1"
    assert re.fullmatch(r"\d\d:\d\d:\d\d", row.locator(".jp-relay-time").inner_text())

    # a fourth request of the session shows without a reload (the panel looks again while it is shown)
    fake.enqueue(Reply(text("four"), usage=Usage(input_tokens=5, output_tokens=5)))
    reply, msgs = execute(kc, "ask(h + [{'role': 'assistant', 'content': 'x'}, {'role': 'user', 'content': 'y'}])",
                          timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    row.locator(".jp-relay-session-requests").filter(has_text=re.compile(r"^4$")).wait_for(timeout=30_000)
    assert row.locator(".jp-relay-session-tokens").inner_text() == f"{tokens + 10:,}"
    page.screenshot(path=str(ARTIFACTS / "panel-sessions.png"), full_page=True)
    page.context.close()
