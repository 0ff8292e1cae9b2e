"""Issue 16: the real ``claude`` CLI, run from a kernel's code in ``-p`` mode with ``relay.claude_env()``, uses
Claude only through relay's Anthropic endpoint: a multi-turn task completes, every request is gated, audited
and charged for the notebook, the upstream sees the broker's key and never the kernel's credential, and a
budget spent mid-task stops the CLI with relay's refusal instead of a retry loop.

The CLI is the one bundled in the claude-agent-sdk wheel, with the quiet environment ``claude_env`` sets
(``DISABLE_TELEMETRY``, ``DISABLE_AUTOUPDATER``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``); the upstream is
the shipped ``FakeAnthropic``. ``peer``; only inside a network namespace (``make test-claude-code``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import hypothesis  # noqa: F401  (see tests/runtime/claude_code_rig.py: an end-of-session SystemError)
import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .conftest import execute, text_of
from .real_server import RealServer
from .test_claude_code_kernel import _isolated

pytest.importorskip("claude_agent_sdk")

KEY = "sk-ant-broker-key-cli-endpoint-0123456789"
MODEL = "claude-fake-1"

pytestmark = [pytest.mark.peer, pytest.mark.slow,
              pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")]

# the cell that runs the CLI: its result, exit code, and a digest of the kernel's credential (never the value)
CLI_CELL = '''
import hashlib, json, os, subprocess, tempfile
from pathlib import Path
import claude_agent_sdk
cli = str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")
env = {{**relay.claude_env(), "HOME": tempfile.mkdtemp(prefix="cli-home-")}}
quiet = {{k: env.get(k) for k in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")}}
p = subprocess.run([cli, "-p", {prompt!r}, "--model", "{model}", "--output-format", "json", "--max-turns", "5"],
                   env=env, capture_output=True, text=True, timeout=240)
print("RESULT " + json.dumps({{"rc": p.returncode, "out": p.stdout[-6000:], "err": p.stderr[-3000:], "quiet": quiet,
      "credential": hashlib.sha256(os.environ["RELAY_KERNEL_CREDENTIAL"].encode()).hexdigest()}}))
'''


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        tmp = tmp_path_factory.mktemp("cli-endpoint")
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": KEY, "default_model": MODEL}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("cli.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            assert execute(kc, "relay.connect(['*'])")[0]["status"] == "ok"
            yield srv, fake, kc


def _run_cli(kc: Any, prompt: str) -> dict[str, Any]:
    reply, msgs = execute(kc, CLI_CELL.format(prompt=prompt, model=MODEL), timeout=300)
    assert reply["status"] == "ok", text_of(msgs)
    (line,) = [ln for ln in text_of(msgs).splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _audit(kc: Any) -> list[dict[str, Any]]:
    reply, msgs = execute(kc, "print('AUDIT ' + relay.audit(500).to_json(orient='records'))", timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    (line,) = [ln for ln in text_of(msgs).splitlines() if ln.startswith("AUDIT ")]
    return json.loads(line[len("AUDIT "):])


def test_a_multi_turn_cli_task_completes_through_the_gate(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    notes = srv.root / "notes.txt"
    notes.write_text("the answer is 42\n")
    first = len(fake.requests)
    fake.enqueue(Reply(text("Reading it."), tool_use("Read", {"file_path": str(notes)})),
                 Reply("The file says the answer is 42."))
    result = _run_cli(kc, "read notes.txt and tell me what it says")
    assert result["rc"] == 0, result
    assert json.loads(result["out"])["result"] == "The file says the answer is 42."
    assert result["quiet"] == {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    requests = fake.requests[first:]
    assert len(requests) == 2  # two model turns: the tool call, then the answer after the tool's result
    assert "the answer is 42" in json.dumps(requests[1].body["messages"])  # the CLI ran the Read itself
    # the upstream got the broker's key (FakeAnthropic refuses any other) and never the kernel's credential
    for request in requests:
        presented = {hashlib.sha256(v.encode()).hexdigest() for v in request.headers.values()}
        assert result["credential"] not in presented
        assert fake.saw_api_key(KEY)
    # each request was gated and charged for this notebook (purpose: proxy)
    model_rows = [r for r in _audit(kc) if str(r.get("tool", "")).startswith("model:")]
    allowed = [r for r in model_rows if r["decision"] == "allow"]
    settled = [r for r in model_rows if r["decision"] == "settled"]
    assert len(allowed) >= 2 and len(settled) >= 2, model_rows
    assert all(r["origin"] == "notebook:cli.ipynb" for r in model_rows)


def test_a_budget_spent_mid_task_stops_the_cli_with_relays_refusal(
        stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, _ = stack
    # another notebook, whose grant allows two model requests a minute: the task's third is refused by the gate
    kc = srv.kernel_for("cli2.ipynb")
    assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
    assert execute(kc, "relay.connect(['*'], budget={'requests_per_minute': 2})")[0]["status"] == "ok"
    notes = srv.root / "more.txt"
    notes.write_text("more\n")
    first = len(fake.requests)
    fake.enqueue(Reply(tool_use("Read", {"file_path": str(notes)})), Reply(tool_use("Read", {"file_path": str(notes)})),
                 Reply("never sent"))
    result = _run_cli(kc, "read more.txt twice")
    sent = len(fake.requests) - first
    assert sent == 2, sent  # two turns ran; nothing past the budget reached the model server
    out = json.loads(result["out"]) if result["out"].strip().startswith("{") else {"result": result["out"]}
    shown = json.dumps(out) + result["err"]
    assert "BUDGET_EXCEEDED" in shown, result  # the CLI reports relay's refusal
