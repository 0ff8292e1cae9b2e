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


# ------------------------------------------------------------------ issue 13: widget polish
BROKER_PUSH = {**PUSH, "preview": {"target": "clean.py", "size": 2020, "sha256": "cd" * 32,
                                   "head": ["import pandas", "df = 1"]},
               "reasons": ["writes clean.py in the Jupyter root (new file)", f"size 2020 bytes, sha256 {'cd' * 32}",
                           "head (secret-looking lines masked):\nimport pandas\ndf = 1"]}


@pytest.mark.asyncio
async def test_push_card_says_each_fact_once_and_keeps_the_head_on_its_lines() -> None:
    # the broker's own reasons for a push (workspace/tools.py) beside the card's preview section
    card = ConsentCard(BROKER_PUSH)
    html = "".join(getattr(child, "value", "") for child in card.widget.children)
    assert html.count("cd" * 32) == 1 and html.count("import pandas") == 1, html
    assert "2,020 bytes" in html and "writes clean.py in the Jupyter root" in html
    assert "<pre style=\"margin:0\">import pandas\ndf = 1</pre>" in html or "import pandas\ndf = 1</pre>" in html
    text = card_text(BROKER_PUSH)
    assert text.count("cd" * 32) == 1 and text.count("import pandas") == 1, text
    assert "import pandas\ndf = 1" in text  # the head keeps its lines in the text fallback


def test_who_answered_is_said_in_words() -> None:
    from relay_jupyter.kernel.widgets.consent_card import answerer

    assert answerer("browser:ed4e1b3d5c9a4f0e8b7d:default") == "you in the side panel"
    assert answerer("kill:browser:alice:default") == "the kill switch (side panel)"
    assert answerer("kill:kernel:abc") == "the kill switch"
    assert answerer("scope:run") == "your earlier “allow for this run”"
    assert answerer("trust:notebook") == "your saved “always allow”"
    assert answerer(None) == "the broker" and answerer("") == "the broker"
    assert answerer("x\u202ey") == "x<U+202E>y"  # anything else is shown, never obeyed


def test_budget_in_words_and_times_as_local_date_times() -> None:
    import time

    import pandas as pd

    from relay_jupyter.kernel.widgets.tables import budget_words, frame, local_time

    words = budget_words({"tokens_per_day": 200000, "cost_per_day_usd": 5.0, "requests_per_minute": 30.0,
                          "max_steps_per_run": 25, "max_tokens_per_run": None, "future_limit": 3})
    assert words == "200,000 tokens/day · $5.00/day · 30 requests/min · 25 steps/run · future_limit=3"
    assert budget_words({}) == "no limits" and budget_words(None) == "no limits"
    assert "{" not in words
    now = time.time()
    assert local_time(now) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    assert local_time(None) == "" and local_time("x") == "" and local_time(float("nan")) == ""
    df = frame([{"ts": now, "tool": "a"}, {"ts": None, "tool": "b"}, {"ts": "bad", "tool": "c"}])
    assert isinstance(df.ts[0], pd.Timestamp) and df.ts[0].tzinfo is not None
    assert abs(df.ts[0].timestamp() - now) < 1 and df.ts[1] is pd.NaT and df.ts[2] is pd.NaT
    assert str(df.ts[0]).startswith(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)))
    assert list(frame([]).columns) == []


def test_grants_table_keeps_the_revoke_button_whole_and_the_origin_as_a_tooltip() -> None:
    from unittest.mock import patch

    async def revoke(origin: str) -> None:
        return None

    long = "notebook:" + "very/long/path/" * 20 + "<x>.ipynb"
    grants = [{"origin": long, "tools": ["run_code"], "models": ["*"], "budget": {"tokens_per_day": 1000}}]
    shown: list[object] = []
    with patch("relay_jupyter.kernel.widgets.tables.show", lambda widget, text: shown.append(widget)):
        GrantsTable(grants, revoke).show()
    row = shown[0].children[1]
    button, label = row.children[0], row.children[1]
    assert button.description == "Revoke" and button.layout.min_width == "6em" and button.layout.flex == "0 0 auto"
    assert "title=\"" + long.replace("<", "&lt;").replace(">", "&gt;") + "\"" in label.value, label.value
    assert "text-overflow:ellipsis" in label.value and "1,000 tokens/day" in label.value
    assert "1,000 tokens/day" in GrantsTable(grants, revoke).text()


@pytest.mark.asyncio
async def test_connect_card_labels_are_whole_and_it_asks_for_a_step_cap() -> None:
    from unittest.mock import patch

    from relay_jupyter.kernel.widgets.connect_card import ConnectCard

    card = ConnectCard("claude-x", [{"name": "run_code", "class": "write"}], {"tokens_per_day": 1000})
    fields = [card.model_field, card.tokens, card.cost, card.rpm, card.steps]
    assert [f.description for f in fields] == ["model", "tokens/day", "USD/day", "requests/min", "steps/run"]
    assert all(f.style.description_width == "initial" for f in fields)  # "requests/…" was cut at 90px
    assert "relay-card" in card.widget._dom_classes
    card.steps.value = 3
    with patch("relay_jupyter.kernel.widgets.connect_card.update"):
        card.connect.click()
        grant = await card.wait(1)
    assert grant is not None and grant["budget"] == {"tokens_per_day": 1000, "cost_per_day_usd": 5.0,
                                                     "requests_per_minute": 30.0, "max_steps_per_run": 3}
    assert card.steps.disabled and card.connect.disabled


@pytest.mark.asyncio
async def test_the_links_of_the_sign_in_and_url_cards_open_a_new_tab() -> None:
    # in the same tab the page replaced JupyterLab (found by tests/kernel/test_elicitation_url_browser.py)
    pytest.importorskip("ipywidgets")
    from unittest.mock import patch

    from relay_jupyter.kernel.widgets.elicitation_card import ElicitationCard
    from relay_jupyter.kernel.widgets.signin_card import SignInCard

    page = "https://auth.example.com/authorize?state=s1"
    with patch("relay_jupyter.kernel.widgets.signin_card.show"), \
            patch("relay_jupyter.kernel.widgets.elicitation_card.show"):
        signin = SignInCard("remote", page)
        signin.show()
        url_card = ElicitationCard({"request_id": "el_1", "server": "shop", "tool": "shop__ask", "mode": "url",
                                    "url": page, "url_host": "auth.example.com", "message": "Pay", "fields": []})
        url_card.show()
    for markup in (signin.widget.value, url_card.widget.children[0].value):
        (anchor,) = [tag for tag in markup.split("<a ")[1:]]
        anchor = anchor.split(">", 1)[0]
        assert 'target="_blank"' in anchor and 'rel="noopener noreferrer"' in anchor, anchor
