"""Consent against the real broker (real Jupyter server + runtime, FakeAnthropic, a kernel the server
started): a run_code card offers one call at a time and shows the code; the broker's consent timeout
marks the card and fails the cell with one PERMISSION_TIMEOUT line; full mode runs without a card and
says so at the top of the cell."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow
MODEL = "claude-fake-1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    with FakeAnthropic(api_key="test-key") as fake:
        tmp = tmp_path_factory.mktemp("e2e-consent")
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  "consent_timeout": 3.0}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("consent.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            assert execute(kc, "relay.connect(['*'])")[0]["status"] == "ok"
            yield srv, fake, kc


def _buttons(msgs: list[dict[str, Any]]) -> list[str]:
    return sorted(m["content"]["data"]["state"].get("description", "") for m in msgs
                  if m["msg_type"] == "comm_open"
                  and m["content"]["data"].get("state", {}).get("_model_name") == "ButtonModel")


def test_broker_timeout_of_a_run_code_card(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    code = "open('timed_out.txt', 'w').write('x')  # <script>window.__pwned=1</script>"
    fake.enqueue(Reply(text("I will write the file."), tool_use("run_code", {"code": code})))
    fake.enqueue(Reply(text("I could not write it.")))
    reply, msgs = execute(kc, "%%agent\nwrite timed_out.txt", timeout=90)  # nobody clicks
    assert reply["status"] == "error", text_of(msgs)
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "run_code timed out and was denied [PERMISSION_TIMEOUT]" in tb[0], tb
    shown = text_of(msgs)
    assert "Timed out — denied" in shown and "I could not write it." in shown
    assert _buttons(msgs) == ["Approve", "Deny"]  # the broker offers run_code once only
    card_html = "".join(str(m["content"]["data"].get("state", {}).get("value", "")) for m in msgs
                        if m["msg_type"] == "comm_open")
    assert "open('timed_out.txt', 'w').write('x')  # &lt;script&gt;window.__pwned=1&lt;/script&gt;" in card_html
    assert not (srv.root / "timed_out.txt").exists()


def test_full_mode_runs_run_code_without_a_card_and_says_so(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    fake.enqueue(Reply(tool_use("run_code", {"code": "open('full.txt', 'w').write('full')"})))
    fake.enqueue(Reply(text("Wrote it in full mode.")))
    reply, msgs = execute(kc, "%%agent --mode full\nwrite full.txt", timeout=90)
    assert reply["status"] == "ok", text_of(msgs)
    assert (srv.root / "full.txt").read_text() == "full"
    assert _buttons(msgs) == []  # no card
    shown = text_of(msgs)
    assert shown.index("full mode") < shown.index("Wrote it in full mode.")
    assert "run without asking you" in shown


def test_hostile_corpus_through_the_real_broker_stays_in_the_allowlist(
        stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    # every output the cell sent (answer blocks, step lines for hostile tool names, the footer) and every
    # widget HTML value is parsed as the browser would and checked against the allowlist
    from relay_jupyter.kernel.rendering import CHROME_TAGS

    from .hostile_corpus import CORPUS, TOOL_NAMES
    from .test_rendering import CHROME_ATTRS, assert_allowlisted, elements

    _, fake, kc = stack
    fake.enqueue(Reply(text("\n\n".join(CORPUS)), *[tool_use(name, {name: name}) for name in TOOL_NAMES]))
    fake.enqueue(Reply(text("corpus done")))
    reply, msgs = execute(kc, "%%agent\nbe hostile", allow_stdin=False, timeout=90)
    assert reply["status"] == "ok", text_of(msgs)
    html = [m["content"]["data"]["text/html"] for m in msgs
            if m["msg_type"] in ("display_data", "update_display_data") and "text/html" in m["content"]["data"]]
    html += [str(m["content"]["data"].get("state", {}).get("value", "")) for m in msgs
             if m["msg_type"] in ("comm_open", "comm_msg")]
    # the step line of the first hostile tool name: its newline and markup shown as text, on one line
    assert any("▸ <code>write`&lt;U+000A&gt;&lt;script&gt;window.__pwned=1&lt;/script&gt;`</code>" in h for h in html)
    for fragment in html:
        assert_allowlisted(fragment, CHROME_TAGS, CHROME_ATTRS)
        for _tag, attrs in elements(fragment):
            assert all("__pwned" not in (value or "") for _name, value in attrs)
    shown = text_of(msgs)
    assert "<script>window.__pwned=1</script>" in shown and "corpus done" in shown
    assert not any(m["msg_type"] == "display_data" and "text/markdown" in m["content"]["data"] for m in msgs)
