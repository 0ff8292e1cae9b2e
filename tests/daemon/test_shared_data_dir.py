"""Two ``jupyter relay serve`` daemons on one data directory (issue 12): a tested configuration.

Each daemon has a live run waiting for a consent click (an MCP write tool in ask mode). The second
daemon's start must not interrupt the first one's run nor withdraw its permission request. Then the
second daemon is SIGKILLed: the first one notices (its maintenance step) and repairs the dead one's
run (``interrupted``, its request withdrawn) with no restart; the second is restarted and finds
nothing left. The first daemon's run is untouched, is answered and finishes ``run.done``. Every run
ends with exactly one terminal event.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import suppress
from pathlib import Path

import pytest
from daemon_harness import Daemon, start_daemon, wait_for

from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

KEY = "sk-ant-test-shared-0123456789"
MCP_SERVER = Path(__file__).resolve().parents[1] / "runtime" / "counting_mcp_server.py"

pytestmark = pytest.mark.slow

PATIENCE = 600.0
"""Every wait is for a condition in the shared store or a daemon's answer; this only bounds a hang (fixed
30-60 s limits failed under load on the shared 2-core machine)."""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _config(tmp: Path, name: str, data: Path, fake: FakeAnthropic, **extra: object) -> Path:
    notes = tmp / f"notes-{name}"
    notes.mkdir(exist_ok=True)
    mcp = tmp / f"mcp-{name}.json"
    mcp.write_text(json.dumps({"mcpServers": {"notes": {"command": sys.executable,
                                                        "args": [str(MCP_SERVER), "--dir", str(notes)]}}}))
    cfg = tmp / f"broker-{name}.json"
    cfg.write_text(json.dumps({"data_dir": str(data), "anthropic_base_url": fake.base_url, "anthropic_api_key": KEY,
                               "mcp_config_path": str(mcp), "default_model": "claude-test-1",
                               "consent_timeout": 600, **extra}))
    return cfg


def _start(tmp: Path, name: str, cfg: Path) -> Daemon:
    root = tmp / name
    root.mkdir(exist_ok=True)
    ensure_private_dir(root / "sock")
    return start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock", "--config", str(cfg))


def _rpc(daemon: Daemon, client: str, method: str, params: dict) -> dict:
    conn = daemon.connect()
    conn.sock.settimeout(PATIENCE)  # two daemons, MCP servers and the test on a loaded machine
    try:
        reply = conn.rpc(method, params, {"X-Relay-Client": client})
    finally:
        conn.close()
    assert "error" not in reply, reply
    return reply["result"]


def _events(data: Path) -> list:
    with Store.open(data / "relay.db") as store:
        return store.events_since(0)


def _terminals(data: Path, run_id: str) -> list[str]:
    return [e.type for e in _events(data) if e.run_id == run_id and e.type in TERMINAL_EVENTS]


def _pending_request(data: Path, run_id: str) -> str | None:
    events = _events(data)
    ended = {e.data.get("request_id") for e in events if e.type == EventType.PERMISSION_RESOLVED}
    asked = [e.data["request_id"] for e in events if e.type == EventType.PERMISSION_REQUEST and e.run_id == run_id]
    return next((r for r in asked if r not in ended), None)


def _wait_tool(daemon: Daemon, client: str) -> None:
    wait_for(lambda: "notes__write_note" in {t["name"] for t in _rpc(daemon, client, "tools.list", {})["tools"]},
             timeout=PATIENCE, what="the MCP tool")


def test_two_daemons_share_a_data_dir_and_a_restart_touches_only_its_own_runs(tmp_path):
    data = ensure_private_dir(tmp_path / "shared")
    with Store.open(data / "relay.db") as store:
        for origin in ("daemon:a", "daemon:b"):
            GrantBook(store).issue(Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                         consent_id="terminal"))
    with FakeAnthropic(api_key=KEY) as fake:
        # a checks for dead brokers every lease_ttl / 3 = 1 s (the default is every 10 s)
        cfg_a, cfg_b = _config(tmp_path, "a", data, fake, lease_ttl=3), _config(tmp_path, "b", data, fake)
        a = _start(tmp_path, "a", cfg_a)
        b = None
        mcp_pids: list[int] = []
        try:
            _wait_tool(a, "a")
            fake.enqueue(Reply(text("Writing."), tool_use("notes__write_note", {"path": "a.txt", "text": "A"},
                                                          id="toolu_a")))
            run_a = _rpc(a, "a", "run.start", {"conversation": "ca", "prompt": "write a", "mode": "ask"})["run_id"]
            wait_for(lambda: _pending_request(data, run_a), timeout=PATIENCE, what="a's permission request")
            request_a = _pending_request(data, run_a)

            # the second daemon starts on the same data dir: its recovery leaves a's live run alone
            b = _start(tmp_path, "b", cfg_b)
            _wait_tool(b, "b")
            assert _rpc(a, "a", "runs.get", {"run_id": run_a})["run"]["state"] == "running"
            assert _pending_request(data, run_a) == request_a
            fake.enqueue(Reply(text("Writing."), tool_use("notes__write_note", {"path": "b.txt", "text": "B"},
                                                          id="toolu_b")))
            run_b = _rpc(b, "b", "run.start", {"conversation": "cb", "prompt": "write b", "mode": "ask"})["run_id"]
            wait_for(lambda: _pending_request(data, run_b), timeout=PATIENCE, what="b's permission request")
            request_b = _pending_request(data, run_b)

            # b dies (SIGKILL: no shutdown code runs) and restarts
            mcp_pids = _children(b.proc.pid)
            b.proc.kill()
            b.proc.wait(PATIENCE)
            for pid in mcp_pids:
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            # a notices b's death by itself (same host, pid gone) and repairs b's run: no restart needed
            wait_for(lambda: _rpc(a, "b", "runs.get", {"run_id": run_b})["run"]["state"] == "interrupted",
                     timeout=PATIENCE, what="a to recover the run of the dead b")
            b = _start(tmp_path, "b", cfg_b)  # and b's restart finds nothing left to repair
            assert _rpc(b, "b", "runs.get", {"run_id": run_b})["run"]["state"] == "interrupted"
            assert _terminals(data, run_b) == [EventType.INTERRUPTED]
            (withdrawn,) = [e for e in _events(data) if e.type == EventType.PERMISSION_RESOLVED
                            and e.data["request_id"] == request_b]
            assert withdrawn.data["decision"] == "withdrawn"
            # a's run lives on, its request still pending and answerable, nothing ended it
            assert _rpc(a, "a", "runs.get", {"run_id": run_a})["run"]["state"] == "running"
            assert _terminals(data, run_a) == [] and _pending_request(data, run_a) == request_a

            fake.enqueue(Reply(text("Done writing a.")))
            _rpc(a, "a", "permission.answer", {"request_id": request_a, "decision": "allow", "scope": "once"})
            wait_for(lambda: _rpc(a, "a", "runs.get", {"run_id": run_a})["run"]["state"] == "done",
                     timeout=PATIENCE, what="a's run to finish")
            assert (tmp_path / "notes-a" / "a.txt").read_text() == "A"
            assert not (tmp_path / "notes-b" / "b.txt").exists()  # b's call was never approved nor run
            # b's restart again (clean this time) changes nothing of a's
            assert b.stop() == 0
            b = _start(tmp_path, "b", cfg_b)
            assert _rpc(b, "b", "runs.get", {"run_id": run_b})["run"]["state"] == "interrupted"
        finally:
            for d in (a, b):
                if d is not None:
                    d.stop()
    assert _terminals(data, run_a) == [EventType.DONE]
    assert _terminals(data, run_b) == [EventType.INTERRUPTED]
    with Store.open(data / "relay.db") as store:
        assert store.leases() == []  # both stopped cleanly at the end: their leases are released
        assert store.runs_to_recover(set()) == []
