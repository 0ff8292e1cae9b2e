"""Issue 16 item 4 against a client nobody here wrote: the real ``claude`` CLI (bundled in claude-agent-sdk), run
from a kernel with ``relay.claude_env()``, through relay's Anthropic endpoint to the shipped FakeAnthropic.

Proves: the CLI's requests are grouped by its own ``X-Claude-Code-Session-Id`` header into one session; its
second request of a multi-turn task (the tool result appended) is classified ``continuation``; the CLI's real
request body replayed with an edited history (its first message kept, the rest replaced) in the same session is
``undo``; telemetry rows carry the charged tokens and never the prompt. ``peer``; only inside a network
namespace (``make test-claude-code``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import hypothesis  # noqa: F401  (see tests/runtime/claude_code_rig.py: an end-of-session SystemError)
import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .conftest import execute, text_of
from .real_server import RealServer
from .test_claude_cli_endpoint import CLI_CELL
from .test_claude_code_kernel import _isolated

pytest.importorskip("claude_agent_sdk")

KEY = "sk-ant-broker-key-cli-lineage-0123456789"
MODEL = "claude-fake-1"
PROMPT = "read lineage-notes.txt and say what it holds"

pytestmark = [pytest.mark.peer, pytest.mark.slow,
              pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any, str]]:
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        tmp = tmp_path_factory.mktemp("cli-lineage")
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": KEY, "default_model": MODEL}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("lineage.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            assert execute(kc, "relay.connect(['*'])")[0]["status"] == "ok"
            _, msgs = execute(kc, "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL'])")
            yield srv, fake, kc, text_of(msgs).split()[-1]


def _telemetry(kc: Any) -> list[dict[str, Any]]:
    reply, msgs = execute(kc, "print('ROWS ' + relay.telemetry().drop(columns=['ts']).to_json(orient='records'))",
                          timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    (line,) = [ln for ln in text_of(msgs).splitlines() if ln.startswith("ROWS ")]
    return json.loads(line[len("ROWS "):])


def test_the_clis_requests_are_one_session_continued_then_undone(stack) -> None:
    srv, fake, kc, credential = stack
    notes = srv.root / "lineage-notes.txt"
    notes.write_text("forty-two\n")
    first = len(fake.requests)
    fake.enqueue(Reply(text("Reading."), tool_use("Read", {"file_path": str(notes)})), Reply("It holds forty-two."))
    reply, msgs = execute(kc, CLI_CELL.format(prompt=PROMPT, model=MODEL), timeout=300)
    assert reply["status"] == "ok", text_of(msgs)
    (line,) = [ln for ln in text_of(msgs).splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["rc"] == 0 and json.loads(result["out"])["result"] == "It holds forty-two.", result
    sent = fake.requests[first:]
    assert len(sent) == 2

    rows = _telemetry(kc)
    assert len(rows) == 2 and all(r["source"] == "proxy" and r["status"] == "ok" for r in rows), rows
    session = rows[0]["session"]
    assert session and not session.startswith(("fp:", "sha256:")), rows  # the CLI's own session header
    assert [r["session"] for r in rows] == [session, session]
    assert [r["lineage"] for r in rows] == ["new", "continuation"]
    assert all(r["input_tokens"] > 0 and r["cost_usd"] > 0 for r in rows)
    assert PROMPT not in json.dumps(rows)

    # the CLI's real second request, its history edited (first message kept, the rest replaced), sent again
    # in the same session: an undo at message 1
    body = dict(sent[1].body)
    assert len(body["messages"]) >= 3, body["messages"]
    body["messages"] = body["messages"][:1] + [{"role": "assistant", "content": "Let me think instead."},
                                               {"role": "user", "content": "never mind the file: just say hi"}]
    fake.enqueue(Reply("hi"))
    req = urllib.request.Request(srv.url + "relay/anthropic/v1/messages?beta=true", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"x-api-key": credential, "content-type": "application/json",
                                          "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": session})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        resp.read()
    rows = _telemetry(kc)
    assert [(r["session"], r["lineage"]) for r in rows] == [(session, "new"), (session, "continuation"),
                                                           (session, "undo")], rows
