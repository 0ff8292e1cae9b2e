"""A broker SIGKILLed while Claude Code runs a tool call (issue 17 item 3, crash repair), then restarted on
the same data directory: the run is ``interrupted`` with one terminal event, the journal answers the call
"outcome unknown", nothing runs it again, no process of the CLI outlives the broker, and the conversation
goes on.

The broker runs in a child process (``claude_code_crash_broker.py``) with the REAL bundled ``claude`` CLI;
``FakeAnthropic`` runs here, so it outlives the kill. ``peer``; only inside ``unshare -n``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .claude_code_rig import KEY, MODEL, NB, ONLY_ISOLATED, close, events, processes_under, terminal

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]

HERE = Path(__file__).parent
CALL_ID = "toolu_cc_crash_0001"
CONVERSATION = "crash"


def _config(tmp_path: Path, fake: FakeAnthropic) -> BrokerConfig:
    return BrokerConfig(data_dir=tmp_path / "relay", default_model=MODEL, consent_timeout=30, anthropic_api_key=KEY,
                        anthropic_base_url=fake.base_url, default_engine="claude-code")


async def _crash(tmp_path: Path, fake: FakeAnthropic, started: Path, *extra: str) -> dict:
    root = tmp_path / "root"
    root.mkdir()
    if not extra:
        # the command records that it started, then runs long (a python child: the CLI blocks a bare `sleep`)
        command = f"echo started >> {started}; /usr/bin/python3 -c 'import time; time.sleep(600)'"
        fake.enqueue(Reply(text("Running it."), tool_use("Bash", {"command": command, "description": "slow"},
                                                         id=CALL_ID)))
    stderr_path = tmp_path / "child.stderr"
    with stderr_path.open("wb") as stderr:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "claude_code_crash_broker.py"), "--data-dir", str(tmp_path / "relay"),
            "--root", str(root), "--base-url", fake.base_url, "--conversation", CONVERSATION, "--origin", NB.origin,
            "--model", MODEL, "--started", str(started), *extra, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env={**os.environ, "RELAY_TEST_KEY": KEY})
    try:
        try:
            line = await asyncio.wait_for(child.stdout.readline(), 120)
        except TimeoutError:
            line = b""
        if not line:
            pytest.fail("the broker child never reported its call in flight:\n"
                        + stderr_path.read_text(errors="replace")[-4000:])
        assert processes_under(tmp_path), "the CLI and its command should be running now"
    finally:
        with suppress(ProcessLookupError):
            child.kill()  # SIGKILL: no shutdown code of the broker runs, exactly like a crash
        await asyncio.wait_for(child.wait(), 10)
    assert child.returncode == -signal.SIGKILL
    return json.loads(line)


async def test_a_broker_killed_mid_tool_call_restarts_with_outcome_unknown_and_leaves_no_process(tmp_path):
    started = tmp_path / "started.txt"
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        report = await _crash(tmp_path, fake, started)
        assert report["call_id"] == CALL_ID and len(fake.requests) == 1

        # nothing of the dead broker's CLI lives on: the launcher saw its parent die and killed the session
        async with asyncio.timeout(30):
            while processes_under(tmp_path):
                await asyncio.sleep(0.1)

        broker = Broker.open(_config(tmp_path, fake))
        install_components(broker, jupyter_root=tmp_path / "root")  # crash repair runs here
        try:
            run = (await call_method(broker, NB, "runs.get", {"run_id": report["run_id"]}))["run"]
            assert run["state"] == "interrupted" and run["finished_at"] is not None
            assert [(c["call_id"], c["tool"]) for c in run["calls"]] == [(CALL_ID, "Bash")]
            assert run["calls"][0]["outcome"] == {"status": "unknown", "outcome_unknown": True}
            ends = [e for e in broker.store.events_since(0)
                    if e.run_id == report["run_id"] and e.type in TERMINAL_EVENTS]
            assert [e.type for e in ends] == [EventType.INTERRUPTED]
            assert ends[0].data["outcome_unknown"] == [CALL_ID]

            # the conversation goes on in the same notebook; the call is never run again
            fake.enqueue(Reply("The earlier command may or may not have finished."))
            run_id = (await call_method(broker, NB, "run.start",
                                        {"conversation": CONVERSATION, "prompt": "what happened?"}))["run_id"]
            assert await terminal(broker, run_id) == EventType.DONE
            assert "may or may not" in "".join(e.data["text"] for e in events(broker, run_id, EventType.TEXT_DELTA))
            assert len(fake.requests) == 2
        finally:
            await close(broker)
            broker.close()
    assert started.read_text().splitlines() == ["started"]  # ran once, before the kill, never again
    assert processes_under(tmp_path) == []


async def test_a_broker_killed_mid_mcp_call_through_the_gateway_restarts_with_that_call_outcome_unknown(tmp_path):
    """An MCP call of the CLI goes through relay's gateway, whose executor journals it as a call of the run (intent
    before, outcome after): killed while the tool runs, the restarted broker answers it "outcome unknown"."""
    notes = tmp_path / "notes"
    notes.mkdir()
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        fake.enqueue(Reply(text("Waiting on it."), tool_use("mcp__relay__t__hang", {"seconds": 600},
                                                            id="toolu_cc_mcp_crash")))
        report = await _crash(tmp_path, fake, tmp_path / "unused", "--tool", "t__hang", "--mcp-dir", str(notes))
        # journalled under the model's own tool_use id (the hook announced it to the gateway)
        assert report["call_id"] == "toolu_cc_mcp_crash" and len(fake.requests) == 1
        async with asyncio.timeout(30):  # the CLI's tree and the user's MCP server (its stdin closed) are gone
            while processes_under(tmp_path):
                await asyncio.sleep(0.1)

        broker = Broker.open(_config(tmp_path, fake))
        install_components(broker, jupyter_root=tmp_path / "root")  # crash repair runs here
        try:
            run = (await call_method(broker, NB, "runs.get", {"run_id": report["run_id"]}))["run"]
            assert run["state"] == "interrupted"
            assert [(c["call_id"], c["tool"]) for c in run["calls"]] == [(report["call_id"], "t__hang")]
            assert run["calls"][0]["outcome"] == {"status": "unknown", "outcome_unknown": True}
            ends = [e for e in broker.store.events_since(0)
                    if e.run_id == report["run_id"] and e.type in TERMINAL_EVENTS]
            assert [e.type for e in ends] == [EventType.INTERRUPTED]
            assert ends[0].data["outcome_unknown"] == [report["call_id"]]
            # the run's own events show the gateway's call: proposed with its arguments, started, never finished
            mine = [e for e in broker.store.events_since(0) if e.run_id == report["run_id"]
                    and e.data.get("call_id") == report["call_id"]]
            assert [e.type for e in mine][:1] == [EventType.TOOL_PROPOSED]
            assert EventType.TOOL_STARTED in [e.type for e in mine]
            assert EventType.TOOL_FINISHED not in [e.type for e in mine]
        finally:
            await close(broker)
            broker.close()
    assert processes_under(tmp_path) == []
