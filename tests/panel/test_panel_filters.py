"""The side panel's lists filtered by the broker, and the profile budgets shown (issues 13, 15, 16).

- A filter's ``tool:``, ``decision:`` and ``notebook:`` terms are asked of the broker (``audit.tail`` / ``runs.list``
  with ``tool``, ``decision``, ``origin_prefix``: docs/protocol.md), so a decision or a run older than the newest
  1000 rows is found. Before, the panel narrowed the newest 200 decisions and 100 runs it had been sent: the old
  match below never showed.
- A grant's profile budgets (``profile_budgets``, budget.get's ``usage.profiles``) are shown read-only beside the
  day budget, in the panel and in ``relay.budget()`` / ``relay.grants()`` of the notebook's kernel.
- A sign-in to an OAuth MCP server started from a cell (``relay.sign_in``) shows its link in the open panel without
  a click or a reload (the broker sends no event for it: the panel reads ``mcp.sign_ins`` again every 10 s while
  shown), and finishing it on the authorization page ends the cell signed in.

Real parts: JupyterLab with the extension on a broker on disk, seeded before it starts (one old decision and run of
``reports/q3.ipynb``, then 1,100 of ``busy.ipynb``), headless Chromium, kernels started by the server, the OAuth MCP
server of tests/mcp (the MCP SDK's server auth, a consent page with Allow / Deny). One JupyterLab for the module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sys

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.types import AuditRecord

from kernel.browser_rig import ARTIFACTS, jp_asyncio_loop, jp_server_cleanup, lab_with_fake, open_relay_panel  # noqa: F401
from kernel.conftest import execute, text_of
from kernel.real_server import TOKEN, RealServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mcp"))  # tests/mcp has no package (the SDK is `mcp`)
from oauth_mcp_server import OAuthMcpServer  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OLD = "notebook:reports/q3.ipynb"
BUSY = "notebook:busy.ipynb"
NEWER = 1_100  # more than any list's maximum (1000): the old rows are older than the newest 1000
PROFILED = "notebook:profiled.ipynb"


def _seed(data_dir: Path) -> None:
    broker = Broker.open(BrokerConfig(data_dir=data_dir))
    try:
        broker.store.run_started("run-old-q3", OLD, "default", {"originator": "seed", "model": "claude-old"})
        broker.store.run_finished("run-old-q3", "done")
        broker.audit.append(AuditRecord(ts=time.time() - 3600, origin=OLD, tool="scratch_push", decision="deny",
                                        answered_by="seed", arguments={}, code="CONSENT_DENIED"))
        for n in range(NEWER):
            broker.store.run_started(f"run-busy-{n}", BUSY, "default", {"originator": "seed"})
            broker.store.run_finished(f"run-busy-{n}", "done")
            broker.audit.append(AuditRecord(ts=time.time(), origin=BUSY, tool="run_code", decision="allow",
                                            answered_by="seed", arguments={}))
    finally:
        broker.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, Any]]:
    tmp = tmp_path_factory.mktemp("panel-filters")
    _seed(tmp / "relay-data")
    with OAuthMcpServer(consent_page=True) as oauth:
        mcp_json = tmp / "mcp.json"
        mcp_json.write_text(json.dumps({"mcpServers": {"remote": {"url": oauth.url}}}))
        with lab_with_fake(tmp, in_memory=False, data_dir=str(tmp / "relay-data"),
                           mcp_config_path=str(mcp_json)) as (srv, _fake, browser):
            yield srv, browser


def _rpc(srv: RealServer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    got = srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    assert "result" in got, got
    return got["result"]


def _panel(srv: RealServer, browser: Any) -> tuple[Any, Any]:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{srv.url}lab?reset&token={TOKEN}")
    return page, open_relay_panel(page)


def test_a_filter_finds_decisions_and_runs_older_than_the_newest_thousand(lab: tuple[RealServer, Any]) -> None:
    srv, browser = lab
    # the broker holds the old rows, behind 1,100 newer ones: the newest 1000 are all busy.ipynb's
    newest = _rpc(srv, "audit.tail", {"n": 1000})["records"]
    assert {r["origin"] for r in newest} == {BUSY}
    page, panel = _panel(srv, browser)
    try:
        rows = panel.locator(".jp-relay-audit .jp-relay-audit-row")
        rows.first.wait_for(timeout=30_000)
        assert rows.filter(has_text="reports/q3.ipynb").count() == 0  # not among the newest
        search = panel.locator(".jp-relay-audit-filter")
        for query in ("tool:scratch_push", "notebook:reports/", "decision:deny", "notebook:reports/ tool:scratch_push q3"):
            search.fill(query)
            old = rows.filter(has_text="reports/q3.ipynb").filter(has_text="scratch_push")
            old.first.wait_for(timeout=30_000)
            texts = [r.inner_text() for r in rows.all()]
            assert len(texts) == 1 and "deny" in texts[0] and "CONSENT_DENIED" in texts[0], (query, texts)
        # the plain words still narrow what the broker sent; a term matches exactly
        search.fill("tool:scratch_push nothing-like-this")
        panel.get_by_text("No decision matches the filter.").wait_for(timeout=30_000)
        assert rows.count() == 0
        search.fill("tool:scratch")
        panel.get_by_text("No decision matches the filter.").wait_for(timeout=30_000)
        search.fill("")
        rows.filter(has_text="busy.ipynb").first.wait_for(timeout=30_000)
        assert rows.filter(has_text="reports/q3.ipynb").count() == 0
        # runs: the newest ten are busy.ipynb's; a notebook folder finds the old run in the journal
        runs = panel.locator(".jp-relay-runs .jp-relay-run")
        assert runs.count() == 10 and runs.filter(has_text="reports/q3.ipynb").count() == 0
        panel.locator(".jp-relay-runs-filter").fill("notebook:reports/")
        runs.filter(has_text="reports/q3.ipynb").first.wait_for(timeout=30_000)
        assert [r.get_attribute("data-run-id") for r in runs.all()] == ["run-old-q3"]
        assert "claude-old" in runs.first.inner_text()
        panel.locator(".jp-relay-runs-filter").fill("notebook:nowhere/")
        panel.get_by_text("No run matches the filter.").wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "panel-filters.png"))
    finally:
        page.context.close()


def test_profile_budgets_show_beside_the_day_budget_in_the_panel_and_the_kernel(lab: tuple[RealServer, Any]) -> None:
    srv, browser = lab
    _rpc(srv, "grants.create", {"origin": PROFILED, "tools": ["list_variables"], "models": ["*"],
                                "budget": {"tokens_per_day": 200_000, "cost_per_day_usd": 5.0},
                                "profiles": ["team", "local"],
                                "profile_budgets": [{"profile": "team", "tokens_per_day": 50_000,
                                                     "cost_per_day_usd": 10.0},
                                                    {"profile": "local", "tokens_per_day": 1_000}]})
    page, panel = _panel(srv, browser)
    try:
        grant = panel.locator(".jp-relay-grant").filter(has_text="profiled.ipynb")
        team = grant.locator(".jp-relay-profile").filter(has_text="profile team")
        team.wait_for(timeout=30_000)
        assert team.locator(".jp-relay-profile-line").inner_text() == (
            "profile team: 0 of 50,000 tokens, $0.0000 of $10.00 today · 50,000 tokens, $10.00 left")
        assert team.locator("progress").count() == 2
        local = grant.locator(".jp-relay-profile").filter(has_text="profile local")
        assert local.locator(".jp-relay-profile-line").inner_text() == (
            "profile local: 0 of 1,000 tokens, $0.0000 today · 1,000 tokens left")
        assert local.locator("progress").count() == 1
        # read-only: no control beside them (the grant's one button is Revoke)
        assert grant.locator(".jp-relay-profile button, .jp-relay-profile input").count() == 0
        # the grant's own day line is still the first
        assert "0 of 200,000 tokens, $0.0000 of $5.00 today" in grant.inner_text()
        page.screenshot(path=str(ARTIFACTS / "panel-profile-budgets.png"))
    finally:
        page.context.close()
    # the notebook's kernel: relay.budget() and relay.grants() show the same limits
    kc = srv.kernel_for("profiled.ipynb")
    reply, msgs = execute(kc, "%load_ext relay_jupyter\nrelay.budget()\nrelay.grants()", timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    shown = text_of(msgs)
    assert "profile team tokens today: 0 / 50000 tokens" in shown, shown
    assert "profile team cost today: 0 / 10 USD" in shown, shown
    assert "profile local tokens today: 0 / 1000 tokens" in shown, shown
    assert "profile local cost" not in shown  # no limit there: no row
    assert "profile budgets: local: 1,000 tokens/day; team: 50,000 tokens/day · $10.00/day" in shown, shown


def test_a_sign_in_started_from_a_cell_shows_in_the_open_panel_without_a_click(lab: tuple[RealServer, Any]) -> None:
    srv, browser = lab
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{srv.url}lab?reset&token={TOKEN}")
    panel = open_relay_panel(page)
    try:
        section = panel.locator(".jp-relay-signins")
        section.get_by_role("button", name="Sign in to remote").wait_for(timeout=60_000)  # needs sign-in
        kc = srv.kernel_for("signin.ipynb")
        reply, msgs = execute(kc, "%load_ext relay_jupyter", timeout=60)
        assert reply["status"] == "ok", text_of(msgs)
        # the cell waits for the person (relay.sign_in blocks until signed in); nothing is clicked in the panel
        cell = kc.execute("r = relay.sign_in('remote', timeout=120)\nprint('SIGNIN', r['state'])")
        link = section.locator("a.jp-relay-signin-link")
        link.wait_for(timeout=60_000)  # mcp.sign_in_changed (no poll any more): no Refresh, no reload
        assert link.get_attribute("rel") == "noopener noreferrer" and link.get_attribute("target") == "_blank"
        with context.expect_page() as opened:
            link.click()
        consent = opened.value
        consent.wait_for_load_state()
        consent.get_by_role("button", name="Allow").click()
        consent.get_by_text("Signed in to remote").wait_for(timeout=30_000)
        section.get_by_text("signed in to remote").wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "panel-signin-from-cell.png"), full_page=True)
        out, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != cell:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert "SIGNIN signed_in" in "".join(out), out
    finally:
        context.close()
