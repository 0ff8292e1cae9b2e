"""The side panel is live (issue 13): opened before anything happens, it shows the first permission request of a
fresh notebook the moment it is made — no Refresh click — including right after a Connect (a refresh then
raced the request and dropped it); and it starts from the live end of the event stream instead of replaying
the log from id 0. Real JupyterLab with the extension, the demo backend, headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .test_main_job import ARTIFACTS, TOKEN, jp_asyncio_loop, jp_server_cleanup, lab_page, lab_server, open_relay_panel, wait_for_kernel  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _notebook(path: Path) -> None:
    cells = [
        "%load_ext relay_jupyter",
        "relay.connect(['scratch_write', 'scratch_edit', 'scratch_push'])",
        "%%agent\nwrite a cleaning script to a file",
    ]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                         "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": src, "outputs": [],
                     "execution_count": None} for i, src in enumerate(cells)]}
    path.write_text(json.dumps(nb))


def _open_panel_and_run(lab: Any, page: Any, name: str) -> Any:
    """Open ``name`` with the relay panel showing, run its three cells, return the panel once the push card
    is in it (learned from the live stream: no Refresh click anywhere)."""
    _notebook(lab.root / name)
    (lab.root / "clean.py").unlink(missing_ok=True)  # the module's JupyterLab: a test before may have pushed it
    page.goto(f"{lab.url}lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # open the panel first: it must learn of the request from the live stream, not from a later refresh
    panel = open_relay_panel(page)
    wait_for_kernel(page)
    page.locator(".jp-Cell").first.click()
    for _ in range(3):
        page.keyboard.press("Shift+Enter")
    panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push").first.wait_for(
        timeout=90_000)
    return panel


def test_the_first_request_appears_in_the_panel_without_refresh(lab_page: tuple[Any, Any]) -> None:
    lab, page = lab_page
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    panel = _open_panel_and_run(lab, page, "live.ipynb")
    assert [u for u in requests if "/relay/events" in u], requests
    assert not [u for u in requests if "relay/events?since=0" in u], requests
    card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push")
    page.screenshot(path=str(ARTIFACTS / "panel-live-request.png"))
    # the same request is answerable from the cell; denying it there removes it from the panel
    page.locator(".jp-OutputArea-output").get_by_role("button", name="Deny").first.click()
    card.first.wait_for(state="detached", timeout=30_000)


def test_the_kill_switch_stops_the_run_and_denies_its_request(lab_page: tuple[Any, Any]) -> None:
    lab, page = lab_page
    panel = _open_panel_and_run(lab, page, "kill.ipynb")
    card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push")

    panel.get_by_role("button", name="Stop all runs").click()
    panel.get_by_text("Stopped 1 run(s), denied 1 request(s).").wait_for(timeout=30_000)
    card.first.wait_for(state="detached", timeout=30_000)
    # the cell ends (one failed-cell line), and nothing was written into the project
    page.locator(".jp-OutputArea-output").filter(has_text="relay:").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "panel-kill.png"))
    assert not (lab.root / "clean.py").exists()


def test_runs_and_decisions_show_their_notebook_and_time(lab_page: tuple[Any, Any]) -> None:
    """Issue 13: the panel's recent decisions name the notebook and the time of each decision, and its runs list
    names each run's notebook; a running run (waiting on its push card) has a Cancel that ends it."""
    import re

    lab, page = lab_page
    panel = _open_panel_and_run(lab, page, "runs.ipynb")
    run = panel.locator(".jp-relay-runs .jp-relay-run").filter(has_text="runs.ipynb").first
    run.wait_for(timeout=30_000)
    assert "running" in run.locator(".jp-relay-run-state").inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d", run.locator(".jp-relay-time").inner_text()), run.inner_text()
    # the audit rows: the grant and the scratch_write/edit decisions so far, each with notebook and time
    rows = panel.locator(".jp-relay-audit .jp-relay-audit-row").filter(has_text="scratch_write")
    rows.first.wait_for(timeout=30_000)
    row = rows.first
    assert row.locator(".jp-relay-notebook").inner_text() == "runs.ipynb", row.inner_text()
    assert row.locator(".jp-relay-notebook").get_attribute("title") == "notebook:runs.ipynb"
    assert re.fullmatch(r"\d\d:\d\d:\d\d", row.locator(".jp-relay-time").inner_text()), row.inner_text()
    page.screenshot(path=str(ARTIFACTS / "panel-runs-and-decisions.png"))
    # the status bar: requests waiting, runs running, today's spend (the demo's estimate), live
    status = page.locator(".jp-relay-status-item")
    status.filter(has_text=re.compile(r"relay: 1 waiting · 1 running · \$\d+\.\d\d today")).wait_for(timeout=30_000)

    run.get_by_role("button", name="Cancel").click()
    # the run ends cancelled (the list refreshes on the run's terminal event), the card leaves, the cell fails
    panel.locator(".jp-relay-runs .jp-relay-run").filter(has_text="runs.ipynb").filter(
        has_text="cancelled").first.wait_for(timeout=60_000)
    panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push").first.wait_for(
        state="detached", timeout=30_000)
    page.locator(".jp-OutputArea-output").filter(has_text="relay:").first.wait_for(timeout=60_000)
    assert not (lab.root / "clean.py").exists()
    status.filter(has_text="relay: 0 waiting · 0 running").wait_for(timeout=30_000)


def test_panel_answers_with_the_offered_scopes_and_filters_the_audit(lab_page: tuple[Any, Any]) -> None:
    """Issue 13: the panel's card offers the scopes the cell's card offers (a push: once, run, notebook) and an
    answer with a wider scope takes effect (Allow for this run: the push goes through); the recent decisions
    have a filter (every word must match the notebook, tool, decision or code)."""
    lab, page = lab_page
    panel = _open_panel_and_run(lab, page, "scoped.ipynb")
    card = panel.locator(".jp-relay-approvals .jp-relay-card").filter(has_text="scratch_push").first
    assert [b.inner_text() for b in card.locator("button").all()] == [
        "Approve", "Deny", "Allow for this run", "Always allow for this notebook"]
    card.get_by_role("button", name="Allow for this run").click()
    card.wait_for(state="detached", timeout=30_000)
    page.locator(".jp-OutputArea-output").filter(has_text="✓ done").first.wait_for(timeout=90_000)
    assert (lab.root / "clean.py").exists()
    page.locator(".jp-OutputArea-output").get_by_text("for this run", exact=False).first.wait_for(timeout=30_000)

    rows = panel.locator(".jp-relay-audit .jp-relay-audit-row")
    rows.filter(has_text="scratch_push").filter(has_text="allow").first.wait_for(timeout=30_000)
    assert rows.filter(has_text="scratch_write").count() >= 1
    search = panel.locator(".jp-relay-audit-filter")
    search.fill("PUSH allow")
    texts = [r.inner_text() for r in rows.all()]
    assert texts and all("scratch_push" in t and "allow" in t for t in texts), texts
    search.fill("scoped.ipynb scratch_write")
    texts = [r.inner_text() for r in rows.all()]
    assert texts and all("scratch_write" in t for t in texts), texts
    search.fill("no-such-tool-anywhere")
    assert rows.count() == 0
    page.screenshot(path=str(ARTIFACTS / "panel-scoped-and-filter.png"))
    search.fill("")
    assert rows.count() >= 2
