"""Widgets and their text fallbacks, built outside a kernel (ipywidgets uses a dummy comm there)."""

from __future__ import annotations

import pytest

from relay_jupyter.kernel.widgets.consent_card import ConsentCard, card_text
from relay_jupyter.kernel.widgets.diff_view import DiffView, split_hunks
from relay_jupyter.kernel.widgets.tables import BudgetMeters, GrantsTable, RunView, budget_numbers

DIFF = """--- a/notes.txt
+++ b/notes.txt
@@ -1,2 +1,2 @@
 keep
-<script>old()</script>
+<img src=x onerror=alert(1)>
@@ -10 +10 @@
-x
+y
"""

PUSH = {"request_id": "p1", "run_id": "r1", "call_id": "c1", "tool": "ws__push", "server": None,
        "tool_class": "write", "arguments": {"path": "notes.txt", "target": "<b>notes.txt</b>"},
        "reasons": ["writes outside the workspace", "<i>reason</i>"],
        "preview": {"target": "notes.txt", "size": 42, "sha256": "ab" * 32, "head": "line <1>", "diff": DIFF},
        "deadline": 0}


def test_diff_view_colours_collapses_and_escapes() -> None:
    header, hunks = split_hunks(DIFF)
    assert len(header) == 2 and [h for h, _ in hunks] == ["@@ -1,2 +1,2 @@", "@@ -10 +10 @@"]
    html = DiffView(DIFF, "notes.txt", open_hunks=1).html()
    assert html.count("<details") == 2 and html.count("<details open") == 1
    assert "<script>" not in html and "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "#e6ffec" in html and "#ffebe9" in html and "+1 −1" in html
    assert DiffView(DIFF)._repr_mimebundle_()["text/plain"] == DIFF


@pytest.mark.asyncio
async def test_push_card_shows_target_digest_head_and_diff_escaped() -> None:
    card = ConsentCard(PUSH)
    html = "".join(getattr(child, "value", "") for child in card.widget.children)
    assert "notes.txt" in html and "ab" * 32 in html and "line &lt;1&gt;" in html
    assert "&lt;b&gt;notes.txt&lt;/b&gt;" in html and "&lt;i&gt;reason&lt;/i&gt;" in html
    assert "<b>notes.txt</b>" not in html and "<i>reason</i>" not in html
    assert [b.description for b in card.buttons] == ["Approve", "Deny", "Allow for this run",
                                                    "Always allow for this notebook"]
    text = card_text(PUSH)
    assert "sha256: " + "ab" * 32 in text and "+<img" in text


@pytest.mark.asyncio
async def test_card_answer_disables_buttons_and_ignores_a_second_click() -> None:
    from unittest.mock import patch

    card = ConsentCard(PUSH)
    with patch("relay_jupyter.kernel.widgets.consent_card.update"):  # no kernel to send the update to
        card.buttons[2].click()
        card.buttons[1].click()
        assert await card.wait(1) == ("allow", "run")
    assert all(b.disabled for b in card.buttons)
    assert "Approved for this run by you (click)" in card.status.value


@pytest.mark.asyncio
async def test_card_timeout_denies() -> None:
    from unittest.mock import patch

    card = ConsentCard(PUSH)
    with patch("relay_jupyter.kernel.widgets.consent_card.update"):
        assert await card.wait(0.05) == ("timeout", "once")
    assert "Timed out — denied at" in card.status.value


def test_budget_numbers_from_budget_get() -> None:
    # the broker's budget.get result: {origin, usage: BudgetLedger.usage(...)}
    info = {"origin": "notebook:a.ipynb", "usage": {
        "day": "2026-12-01", "tokens": 1200, "cost_usd": 0.5, "reserved_tokens": 0, "reserved_cost_usd": 0.0,
        "tokens_limit": 2000, "cost_limit": None, "rpm_limit": 30, "rpm_available": 27.4}}
    rows = budget_numbers(info)
    assert rows == [("tokens today", 1200.0, 2000.0, "tokens"), ("estimated cost today", 0.5, None, "USD"),
                    ("requests in the last minute", 3.0, 30.0, "req")]
    assert "1200 / 2000 tokens" in BudgetMeters(info).text() and "no limit" in BudgetMeters(info).text()
    # no rate limit: the broker keeps no bucket, so the count is unknown rather than a made-up 0
    unlimited = {"origin": "o", "usage": {"tokens": 0, "cost_usd": 0.0, "tokens_limit": None, "cost_limit": None,
                                          "rpm_limit": None, "rpm_available": None}}
    assert budget_numbers(unlimited)[2] == ("requests in the last minute", None, None, "req")
    assert "— / no limit req" in BudgetMeters(unlimited).text()


def test_run_view_reads_runs_get() -> None:
    run = {"run_id": "run_1", "origin": "notebook:a.ipynb", "conversation": "c", "state": "done",
           "started_at": 1_700_000_000.0, "finished_at": 1_700_000_002.5,
           "meta": {"model": "claude-x", "backend": "anthropic", "mode": "ask", "originator": "kernel:k", "steps": 2},
           "calls": [{"run_id": "run_1", "call_id": "c1", "tool": "run_code", "arguments": {"code": "1"},
                      "intent_at": 1_700_000_001.0, "outcome": {"status": "ok", "code": None, "chars": 3},
                      "outcome_at": 1_700_000_001.25}]}
    text = RunView(run).text()
    assert "model claude-x (anthropic), 2 model steps" in text and "took 2.5 s" in text
    assert "run_code: ok 250.0 ms" in text


def test_grants_and_run_text_fallbacks_escape_in_html() -> None:
    async def revoke(origin: str) -> None:
        return None

    grants = [{"origin": "notebook:<x>.ipynb", "tools": ["run_code"], "models": ["*"], "budget": {}}]
    assert "notebook:<x>.ipynb: tools [run_code]" in GrantsTable(grants, revoke).text()
    run = RunView({"run_id": "r1", "state": "done", "meta": {"model": "m"},
                   "calls": [{"tool": "<b>t</b>", "outcome": {"status": "ok"}, "intent_at": 1.0, "outcome_at": 1.005}]})
    bundle = run._repr_mimebundle_()
    assert "&lt;b&gt;t&lt;/b&gt;" in bundle["text/html"] and "<b>t</b>: ok" in bundle["text/plain"]
