"""The documentation notebooks do what they say under ``make lab`` (issue 13 item 6), run cell by cell in a real
JupyterLab (the relay extension, the demo backend, no key) in headless Chromium: ``budgets_and_audit.ipynb``'s
cell that fails on purpose fails with BUDGET_EXCEEDED and the audit shows it (its small budget was applied
only headless); ``mcp_tools.ipynb`` gets its MCP server's tool at once, with no traceback, and its call asks
on a card."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .test_main_job import ARTIFACTS, REPO, TOKEN, jp_asyncio_loop, jp_server_cleanup, lab_page, lab_server, wait_for_kernel  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _copy(lab: Any, name: str) -> list[dict[str, Any]]:
    """The repository's notebook without its stored outputs (so everything seen was produced here)."""
    notebook = json.loads((REPO / "notebooks" / name).read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    (lab.root / name).write_text(json.dumps(notebook))
    return notebook["cells"]


def _open(lab: Any, page: Any, name: str) -> None:
    page.goto(f"{lab.url}lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)


def _run(page: Any, index: int, *, timeout: float = 120_000) -> str:
    """Run cell ``index`` as a reader does (click it, Shift+Enter) and wait until it has finished; its output."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-prompt, .jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    prompt = cell.locator(".jp-InputPrompt").first
    page.wait_for_function("el => /\\[\\d+\\]/.test(el.textContent)", arg=prompt.element_handle(), timeout=timeout)
    return cell.locator(".jp-OutputArea").first.inner_text() if cell.locator(".jp-OutputArea").count() else ""


def _index(cells: list[dict[str, Any]], cell_id: str) -> int:
    return next(i for i, c in enumerate(cells) if c.get("id") == cell_id)


def test_budgets_notebook_fails_on_purpose_under_make_lab(lab_page: tuple[Any, Any]) -> None:
    lab, page = lab_page
    cells = _copy(lab, "budgets_and_audit.ipynb")
    _open(lab, page, "budgets_and_audit.ipynb")
    outputs = {}
    for cell in cells[: _index(cells, "c14") + 1]:
        if cell["cell_type"] == "code":
            outputs[cell["id"]] = _run(page, _index(cells, cell["id"]))
    assert "max steps per run: 2" in outputs["c04"], outputs["c04"]
    assert "[demo] Hello" in outputs["c05"] and "✓ done" in outputs["c05"], outputs["c05"]
    # the cell that fails on purpose: one relay line with the code, no traceback
    assert "relay:" in outputs["c08"] and "BUDGET_EXCEEDED" in outputs["c08"], outputs["c08"]
    assert "Traceback" not in outputs["c08"]
    assert re.search(r"deny\s+BUDGET_EXCEEDED", outputs["c14"]), outputs["c14"]
    page.screenshot(path=str(ARTIFACTS / "lab-budgets-notebook.png"))


def test_mcp_notebook_under_make_lab(lab_page: tuple[Any, Any]) -> None:
    lab, page = lab_page
    cells = _copy(lab, "mcp_tools.ipynb")
    _open(lab, page, "mcp_tools.ipynb")
    for cell_id in ("c01", "c03", "c04", "c05"):
        out = _run(page, _index(cells, cell_id))
        assert "Traceback" not in out and "Error" not in out, (cell_id, out)
        if cell_id == "c01":
            assert "not installed" not in out, out  # make lab installs mcp-server-time (the lab extra)
        if cell_id == "c03":
            assert "'time__get_current_time'" in out, out
    # in JupyterLab the unpinned MCP tool (a write) asks on a card; approving it lets the call through
    cell = page.locator(".jp-Notebook .jp-Cell").nth(_index(cells, "c07"))
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    approve = cell.get_by_role("button", name=re.compile("^(Approve|Allow)"))
    approve.first.wait_for(timeout=90_000)
    page.screenshot(path=str(ARTIFACTS / "lab-mcp-card.png"))
    approve.first.click()
    cell.locator(".jp-OutputArea-output").filter(has_text="✓ done").first.wait_for(timeout=90_000)
    assert "time__get_current_time" in cell.inner_text()
