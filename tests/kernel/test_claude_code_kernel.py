"""``%%agent --engine claude-code`` in a real kernel of a real Jupyter server (issue 17 item 3): the card for a
Claude Code ``Bash`` call appears in the cell (Approve: the command ran; Deny: it did not), and an interrupted
cell kills the CLI's process tree and ends its run with exactly one terminal event.

The REAL bundled ``claude`` CLI, run by the broker in the Jupyter server, against ``FakeAnthropic`` through
relay's Anthropic endpoint. ``peer``; only inside a network namespace (``make test-claude-code``).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401  (see tests/runtime/claude_code_rig.py: an end-of-session SystemError)
import pytest

from relay_jupyter.protocol.names import TERMINAL_EVENTS
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .conftest import execute, text_of
from .real_server import RealServer

pytest.importorskip("claude_agent_sdk")

KEY = "sk-ant-broker-key-cc-kernel-0123456789"
MODEL = "claude-fake-1"


def _isolated() -> bool:
    """True inside a network namespace with only loopback (``unshare -n``): no route out."""
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
        ifaces = {line.split()[0].rstrip(":") for line in Path("/proc/net/dev").read_text().splitlines()[2:]
                  if line.strip()}
    except OSError:
        return False
    return not routes and ifaces <= {"lo"}


pytestmark = [pytest.mark.peer, pytest.mark.slow,
              pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any, Path]]:
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        tmp = tmp_path_factory.mktemp("cc-kernel")
        data = tmp / "relay"
        config = {"in_memory": False, "data_dir": str(data), "anthropic_base_url": fake.base_url,
                  "anthropic_api_key": KEY, "default_model": MODEL, "consent_timeout": 60.0}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("cc.ipynb")
            assert execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'widget'")[0][
                "status"] == "ok"
            assert execute(kc, "relay.connect(['*'])")[0]["status"] == "ok"
            yield srv, fake, kc, data


def _clicker(kc: Any, label: str) -> tuple[Any, list[dict[str, Any]]]:
    """Clicks the first button labelled ``label`` as a browser would; collects the card's HTML."""
    seen: list[dict[str, Any]] = []

    def observe(msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open":
            return
        state = msg["content"]["data"].get("state", {})
        seen.append(state)
        if state.get("_model_name") == "ButtonModel" and state.get("description") == label and \
                not any(s.get("clicked") for s in seen):
            state["clicked"] = True
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))

    return observe, seen


def _terminal_events(data: Path) -> dict[str, list[str]]:
    """run_id -> its terminal event types, read from the broker's own database (WAL: readable meanwhile)."""
    with sqlite3.connect(f"file:{data / 'relay.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT run_id, type FROM events WHERE run_id IS NOT NULL ORDER BY id").fetchall()
    out: dict[str, list[str]] = {}
    for run_id, type_ in rows:
        if type_ in TERMINAL_EVENTS:
            out.setdefault(run_id, []).append(type_)
    return out


def _with(cmd_part: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cmd_part.encode() in cmd and state not in ("Z", "X"):
                found.append(int(pid))
    return found


def _cwd_under(directory: Path) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cwd.startswith(str(directory)) and state not in ("Z", "X"):
                found.append(int(pid))
    return found


@pytest.mark.parametrize("label", ["Approve", "Deny"])
def test_the_card_for_a_claude_code_command_decides_whether_it_runs(
        stack: tuple[RealServer, FakeAnthropic, Any, Path], label: str) -> None:
    srv, fake, kc, _ = stack
    marker = srv.tmp / f"{label.lower()}-{secrets.token_hex(4)}.txt"
    command = f"echo {label} > {marker}"
    fake.enqueue(Reply(text("I will run one command."), tool_use("Bash", {"command": command, "description": "x"})),
                 Reply(f"Finished after {label}."))
    observe, seen = _clicker(kc, label)
    reply, msgs = execute(kc, "%%agent --engine claude-code\nwrite the marker", on_iopub=observe, timeout=180)
    assert reply["status"] == "ok", text_of(msgs)
    assert any(s.get("clicked") for s in seen), "the card did not appear"
    card = json.dumps([s.get("value", "") for s in seen if s.get("_model_name") == "HTMLModel"])
    assert "Bash" in card and f"echo {label} &gt; {marker}" in card  # the exact command, escaped, on the card
    assert f"Finished after {label}." in text_of(msgs)
    if label == "Approve":
        assert marker.read_text().strip() == "Approve"
    else:
        assert not marker.exists()
        sent = fake.requests[-1].body["messages"][-1]["content"]
        assert any(b.get("type") == "tool_result" and b.get("is_error") for b in sent if isinstance(b, dict))


def test_claude_code_reads_and_runs_code_in_the_notebooks_own_kernel(
        stack: tuple[RealServer, FakeAnthropic, Any, Path]) -> None:
    """The kernel's tools reach Claude Code through relay's gateway (issue 17): ``list_variables`` runs in this
    kernel without a card; ``run_code`` shows its exact code on the card and, approved, runs in this kernel."""
    srv, fake, kc, _ = stack
    name = f"sales_total_{secrets.token_hex(3)}"
    assert execute(kc, f"{name} = 1234")[0]["status"] == "ok"
    fake.enqueue(Reply(tool_use("mcp__relay__list_variables", {}, id="toolu_k_vars")),
                 Reply(tool_use("mcp__relay__run_code", {"code": f"print({name} * 2)"}, id="toolu_k_run")),
                 Reply("Twice the total is 2468."))
    observe, seen = _clicker(kc, "Approve")
    reply, msgs = execute(kc, "%%agent --engine claude-code\ndouble my total", on_iopub=observe, timeout=180)
    assert reply["status"] == "ok", text_of(msgs)
    assert "Twice the total is 2468." in text_of(msgs)
    cards = [s.get("value", "") for s in seen if s.get("_model_name") == "HTMLModel"]
    assert sum("run_code" in c for c in cards) >= 1 and any(f"print({name} * 2)" in c for c in cards)
    assert not any("list_variables" in c for c in cards)  # the read asked nothing
    results = {}
    for request in fake.requests:
        for message in (request.body or {}).get("messages") or []:
            for block in message.get("content") if isinstance(message.get("content"), list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    results[block["tool_use_id"]] = json.dumps(block.get("content"))
    assert name in results["toolu_k_vars"] and "int" in results["toolu_k_vars"]
    assert "2468" in results["toolu_k_run"]


def test_an_interrupted_cell_kills_the_cli_tree_with_one_terminal_event(
        stack: tuple[RealServer, FakeAnthropic, Any, Path]) -> None:
    srv, fake, kc, data = stack
    tag = f"time.sleep(4{secrets.randbelow(9000) + 1000})"
    fake.enqueue(Reply(tool_use("Bash", {"command": f"/usr/bin/python3 -c 'import time; {tag}'",
                                         "description": "wait"})))
    (session,) = [s for s in srv.api("GET", "api/sessions") if s["path"] == "cc.ipynb"]
    kernel_id = session["kernel"]["id"]
    before = set(_terminal_events(data))

    def interrupt_once_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _with(tag):
            time.sleep(0.1)  # waiting for the CLI to start the command
        srv.api("POST", f"api/kernels/{kernel_id}/interrupt")

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    reply, msgs = execute(kc, "%%agent --engine claude-code --mode full\nwait a long time", timeout=180)
    assert reply["status"] == "error", text_of(msgs)
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "interrupted" in tb[0], tb
    # the run's end is committed with its event; wait for it (the kernel returns at once after the interrupt)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not set(_terminal_events(data)) - before:
        time.sleep(0.1)
    (run_id,) = set(_terminal_events(data)) - before
    assert _terminal_events(data)[run_id] == ["run.cancelled"]
    assert _with(tag) == []  # the command the CLI started is gone
    assert _cwd_under(data) == []  # and no process of the CLI runs in a workspace
    # the kernel and the engine are usable afterwards
    fake.enqueue(Reply("Still here."))
    reply, msgs = execute(kc, "%%agent --engine claude-code\nare you there?", timeout=180)
    assert reply["status"] == "ok" and "Still here." in text_of(msgs), text_of(msgs)
