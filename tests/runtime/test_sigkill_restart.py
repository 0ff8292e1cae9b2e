"""A broker SIGKILLed in the middle of a tool call, then restarted on the same data directory.

The broker runs in a child process (``sigkill_broker.py``): durable store, runtime, MCP registry with
a server whose ``hang`` tool never answers. FakeAnthropic runs here, in the parent, so it outlives
the kill. Once the journal holds the call's intent (and the MCP server has logged that the tool
started), the child and its MCP server's process group get SIGKILL. A new Broker on the same data
directory must then show the run ``interrupted``, answer the call "outcome unknown" in the stored
conversation, never run the tool again, and send the model a well-formed history on the next run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components, start_components, stop_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.context import OUTCOME_UNKNOWN
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .counting_mcp_server import CALLS_FILE

HERE = Path(__file__).parent
KEY = "sk-ant-test-sigkill-0123456789"
MODEL = "claude-test-1"
ORIGIN = "notebook:crash.ipynb"
CONVERSATION = "conv-crash"
CALL_ID = "toolu_hang_0001"
NB = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:after-restart")


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (the MCP server runs in its own session, so it must be found and
    killed on its own: a SIGKILL of its parent does not reach it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            stat = (entry / "stat").read_text()
            # the command name is in parentheses and may hold spaces: split after the last ')'
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


async def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not all(_gone(p) for p in pids):
            await asyncio.sleep(0.02)


async def _wait_file_lines(path: Path, n: int, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not (path.exists() and len(path.read_text().splitlines()) >= n):
            await asyncio.sleep(0.02)


def _layout(tmp_path: Path) -> dict[str, Path]:
    paths = {"data": tmp_path / "relay", "root": tmp_path / "root", "notes": tmp_path / "notes",
             "mcp": tmp_path / "mcp.json", "stderr": tmp_path / "child.stderr"}
    for key in ("root", "notes"):
        paths[key].mkdir()
    paths["mcp"].write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable,
        "args": [str(HERE / "counting_mcp_server.py"), "--dir", str(paths["notes"])]}}}))
    return paths


async def _crash_a_broker(paths: dict[str, Path], fake: FakeAnthropic) -> dict[str, Any]:
    """Run the child broker until its ``hang`` call is in flight, then SIGKILL it and its MCP server."""
    fake.enqueue(Reply(text("Let me wait for it."), tool_use("notes__hang", {"seconds": 600}, id=CALL_ID)))
    env = {**os.environ, "RELAY_TEST_KEY": KEY}
    with paths["stderr"].open("wb") as stderr:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "sigkill_broker.py"),
            "--data-dir", str(paths["data"]), "--root", str(paths["root"]), "--base-url", fake.base_url,
            "--mcp-config", str(paths["mcp"]), "--conversation", CONVERSATION, "--origin", ORIGIN,
            "--model", MODEL, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    mcp_pids: list[int] = []
    try:
        try:
            line = await asyncio.wait_for(child.stdout.readline(), 25)
        except TimeoutError:
            line = b""
        if not line:
            pytest.fail("the broker child never reported its call in flight:\n"
                        + paths["stderr"].read_text(errors="replace")[-4000:])
        report = json.loads(line)
        # the intent is written just before the MCP request is sent: wait until the tool really runs
        await _wait_file_lines(paths["notes"] / CALLS_FILE, 1)
        mcp_pids = _children(child.pid)
        assert mcp_pids, "the MCP server process of the child broker was not found"
    finally:
        with suppress(ProcessLookupError):
            child.kill()  # SIGKILL: no shutdown code runs, exactly like a crash
        for pid in mcp_pids or _children(child.pid):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: pgid == pid
        await asyncio.wait_for(child.wait(), 10)
    assert child.returncode == -signal.SIGKILL
    await _wait_gone(mcp_pids)  # nothing leaked
    return report


def _open_broker(paths: dict[str, Path], fake: FakeAnthropic) -> Broker:
    """A new broker process' worth of state on the crashed broker's data dir (recover() runs here)."""
    broker = Broker.open(BrokerConfig(data_dir=paths["data"], mcp_config_path=paths["mcp"],
                                      default_model=MODEL, consent_timeout=30))
    backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
    install_components(broker, jupyter_root=paths["root"], backends={"anthropic": backend})
    return broker


def _terminals(broker: Broker, run_id: str) -> list[str]:
    return [e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_sigkilled_mid_tool_call_restarts_interrupted_with_outcome_unknown(tmp_path):
    paths = _layout(tmp_path)
    with FakeAnthropic(api_key=KEY) as fake:
        report = await _crash_a_broker(paths, fake)
        run_id = report["run_id"]
        assert report["call_id"] == CALL_ID
        assert len(fake.requests) == 1

        broker = _open_broker(paths, fake)
        try:
            await start_components(broker)  # a fresh MCP server: it must never see the call again
            # the run is interrupted, its call answered "unknown" in the journal, never re-run
            run = (await call_method(broker, NB, "runs.get", {"run_id": run_id}))["run"]
            assert run["state"] == "interrupted" and run["finished_at"] is not None
            assert [(c["call_id"], c["tool"]) for c in run["calls"]] == [(CALL_ID, "notes__hang")]
            assert run["calls"][0]["outcome"] == {"status": "unknown", "outcome_unknown": True}
            assert _terminals(broker, run_id) == [EventType.INTERRUPTED]
            (event,) = [e for e in broker.store.events_since(0)
                        if e.type == EventType.INTERRUPTED and e.run_id == run_id]
            assert event.data["outcome_unknown"] == [CALL_ID] and event.origin == ORIGIN
            assert broker.runs.get(run_id) is None and not broker.runs.busy(CONVERSATION)

            # the stored history answers the hanging call, right after the assistant turn that made it
            messages = broker.store.load_conversation(CONVERSATION)["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant", "user"]
            assert [b["id"] for b in messages[1]["content"] if b["type"] == "tool_use"] == [CALL_ID]
            (answer,) = messages[2]["content"]
            assert answer["type"] == "tool_result" and answer["tool_use_id"] == CALL_ID
            assert OUTCOME_UNKNOWN in json.dumps(answer["content"]) and answer["is_error"] is True

            # the next run in the same conversation sends a history where every tool_use is answered
            fake.enqueue(Reply(text("The earlier wait may or may not have finished.")))
            started = await call_method(broker, NB, "run.start", {"conversation": CONVERSATION,
                                                                  "prompt": "what happened?"})
            await asyncio.wait_for(broker.runs.wait(started["run_id"]), 20)
            assert _terminals(broker, started["run_id"]) == [EventType.DONE]
            assert len(fake.requests) == 2  # one request before the crash, one for the new run: no replay
            sent = fake.requests[-1].json["messages"]
            assert_every_tool_use_answered(sent)
            sent_answer = json.dumps(sent)
            assert CALL_ID in sent_answer and "outcome unknown" in sent_answer
            assert sent[-1]["role"] == "user" and "what happened?" in json.dumps(sent[-1])
        finally:
            await stop_components(broker)
            broker.close()

        # a second restart changes nothing: recovery is idempotent
        again = _open_broker(paths, fake)
        try:
            assert _terminals(again, run_id) == [EventType.INTERRUPTED]
            assert [m["role"] for m in again.store.load_conversation(CONVERSATION)["messages"]].count("user") == 3
        finally:
            again.close()
    # the hanging tool started exactly once, before the kill, and never again
    assert len((paths["notes"] / CALLS_FILE).read_text().splitlines()) == 1


def assert_every_tool_use_answered(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool_use is answered by a tool_result in the very next (user) message, in order."""
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not isinstance(message["content"], list):
            continue
        uses = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if not uses:
            continue
        assert i + 1 < len(messages) and messages[i + 1]["role"] == "user", f"tool_use at {i} unanswered"
        results = [b["tool_use_id"] for b in messages[i + 1]["content"] if b.get("type") == "tool_result"]
        assert results == uses
