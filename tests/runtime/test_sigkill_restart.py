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
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components, start_components, stop_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.context import OUTCOME_UNKNOWN
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .counting_mcp_server import CALLS_FILE

HERE = Path(__file__).parent
PATIENCE = 600.0
"""Every wait here is for a condition (a line, a process gone, a state in the store); this only bounds a
hang. Fixed 10-25 s limits failed under load: on this 2-core machine at load 9 a child broker took 42 s
to report its call in flight."""
KEY = "sk-ant-test-sigkill-0123456789"
MODEL = "claude-test-1"
ORIGIN = "notebook:crash.ipynb"
CONVERSATION = "conv-crash"
STORED = conversation_key(ORIGIN, CONVERSATION)  # the broker keys conversations by origin
CALL_ID = "toolu_hang_0001"
WRITE_ID = "toolu_write_0001"  # finished before the kill: its outcome is journaled, its result is not stored
LATER_ID = "toolu_echo_0001"  # after the hang in the same turn: never started
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


async def _wait_gone(pids: list[int], timeout: float = PATIENCE) -> None:
    async with asyncio.timeout(timeout):
        while not all(_gone(p) for p in pids):
            await asyncio.sleep(0.02)


async def _wait_file_lines(path: Path, n: int, timeout: float = PATIENCE) -> None:
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
    # write_note is not parallel-safe, so the turn's three calls run one after another
    fake.enqueue(Reply(text("Let me wait for it."),
                       tool_use("notes__write_note", {"path": "before.txt", "text": "hi"}, id=WRITE_ID),
                       tool_use("notes__hang", {"seconds": 600}, id=CALL_ID),
                       tool_use("notes__echo", {"text": "later"}, id=LATER_ID)))
    env = {**os.environ, "RELAY_TEST_KEY": KEY}
    with paths["stderr"].open("wb") as stderr:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "sigkill_broker.py"),
            "--data-dir", str(paths["data"]), "--root", str(paths["root"]), "--base-url", fake.base_url,
            "--mcp-config", str(paths["mcp"]), "--conversation", CONVERSATION, "--origin", ORIGIN,
            "--model", MODEL, "--tool", "notes__hang", stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    mcp_pids: list[int] = []
    try:
        try:
            # the child reports once its call is in flight, or exits: a condition (a start took 42 s at load 9)
            line = await asyncio.wait_for(child.stdout.readline(), PATIENCE)
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
        await asyncio.wait_for(child.wait(), PATIENCE)
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
            assert [(c["call_id"], c["tool"]) for c in run["calls"]] == \
                [(WRITE_ID, "notes__write_note"), (CALL_ID, "notes__hang")]
            assert run["calls"][0]["outcome"]["status"] == "ok"
            assert run["calls"][1]["outcome"] == {"status": "unknown", "outcome_unknown": True}
            assert _terminals(broker, run_id) == [EventType.INTERRUPTED]
            (event,) = [e for e in broker.store.events_since(0)
                        if e.type == EventType.INTERRUPTED and e.run_id == run_id]
            assert event.data["outcome_unknown"] == [CALL_ID] and event.origin == ORIGIN
            assert broker.runs.get(run_id) is None and not broker.runs.busy(STORED)

            # the stored history answers each call of the turn truthfully, in the model's order
            messages = broker.store.load_conversation(STORED)["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant", "user"]
            assert [b["id"] for b in messages[1]["content"] if b["type"] == "tool_use"] == \
                [WRITE_ID, CALL_ID, LATER_ID]
            answers = messages[2]["content"]
            assert [(a["type"], a["tool_use_id"]) for a in answers] == \
                [("tool_result", WRITE_ID), ("tool_result", CALL_ID), ("tool_result", LATER_ID)]
            done, unknown, later = (json.dumps(a["content"]) for a in answers)
            assert "not run" not in done and "completed" in done  # it ran: never tell the model otherwise
            assert OUTCOME_UNKNOWN in unknown and answers[1]["is_error"] is True
            assert "not run" in later and answers[2]["is_error"] is True
            assert (paths["notes"] / "before.txt").read_text() == "hi"

            # the next run in the same conversation sends a history where every tool_use is answered
            fake.enqueue(Reply(text("The earlier wait may or may not have finished.")))
            started = await call_method(broker, NB, "run.start", {"conversation": CONVERSATION,
                                                                  "prompt": "what happened?"})
            await asyncio.wait_for(broker.runs.wait(started["run_id"]), PATIENCE)
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
            assert [m["role"] for m in again.store.load_conversation(STORED)["messages"]].count("user") == 3
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


# -- the same through the standalone daemon (``jupyter relay serve`` on its Unix socket) --------------

DAEMON_CLIENT = "crash"
DAEMON_ORIGIN = f"daemon:{DAEMON_CLIENT}"


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP/1.1 over the daemon's Unix socket (no token there: peer credentials authenticate)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=PATIENCE)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class _Daemon:
    """One ``jupyter relay serve`` process on ``<tmp>/sock/relay.sock``; JSON-RPC as ``daemon:crash``."""

    def __init__(self, tmp: Path, config: Path, env: dict[str, str], root: Path) -> None:
        self.socket = tmp / "sock" / "relay.sock"
        self.stderr = tmp / "daemon.stderr"
        with self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", f"unix://{self.socket}",
                 "--config", str(config)], env=env, cwd=root, stdout=subprocess.PIPE, stderr=err)
        ready, _, _ = select.select([self.proc.stdout], [], [], 40)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("relay daemon listening on"):
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"daemon did not start: {line!r}\n{self.stderr.read_text(errors='replace')[-3000:]}")

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        conn = _UnixHTTP(str(self.socket))
        try:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            conn.request("POST", "/relay/rpc", body, {"Content-Type": "application/json",
                                                      "X-Relay-Client": DAEMON_CLIENT})
            reply = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        assert "error" not in reply, reply
        return reply["result"]

    def wait(self, predicate: Any, what: str, timeout: float = PATIENCE) -> Any:
        """Poll another process' state (there is nothing to await across processes)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"timed out waiting for {what}\n{self.stderr.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.mark.slow
def test_sigkilled_daemon_restarts_interrupted_with_outcome_unknown(tmp_path):
    paths = _layout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RELAY_URL", "RELAY_TOKEN")}
    env.update(JUPYTER_DATA_DIR=str(tmp_path / "jdata"), JUPYTER_RUNTIME_DIR=str(tmp_path / "jrt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "jcfg"), PYTHONUNBUFFERED="1",
               ANTHROPIC_API_KEY=KEY)  # the server's environment is a legitimate key source
    config = tmp_path / "broker.json"
    with FakeAnthropic(api_key=KEY) as fake:
        config.write_text(json.dumps({"data_dir": str(paths["data"]), "anthropic_base_url": fake.base_url,
                                      "mcp_config_path": str(paths["mcp"]), "default_model": MODEL}))
        # the grant a terminal `jupyter relay grants add daemon:crash` would write (tested in tests/daemon)
        store = Store.open(ensure_private_dir(paths["data"]) / "relay.db")
        try:
            GrantBook(store).issue(Grant(origin=DAEMON_ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}),
                                         consent_id="terminal"))
        finally:
            store.close()

        fake.enqueue(Reply(text("Waiting."), tool_use("notes__hang", {"seconds": 600}, id=CALL_ID)))
        daemon = _Daemon(tmp_path, config, env, paths["root"])
        mcp_pids: list[int] = []
        try:
            # MCP servers connect in the background after the daemon listens: wait for the tool
            daemon.wait(lambda: "notes__hang" in {t["name"] for t in daemon.rpc("tools.list", {})["tools"]},
                        "the MCP tool")
            run_id = daemon.rpc("run.start", {"conversation": CONVERSATION, "prompt": "wait", "mode": "full"})["run_id"]
            daemon.wait(lambda: any(c["outcome"] is None
                                    for c in daemon.rpc("runs.get", {"run_id": run_id})["run"]["calls"]),
                        "the intent record")
            daemon.wait(lambda: (paths["notes"] / CALLS_FILE).exists(), "the tool to start")
            mcp_pids = _children(daemon.proc.pid)
            assert mcp_pids
        finally:
            daemon.proc.kill()
            for pid in mcp_pids or _children(daemon.proc.pid):
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            daemon.proc.wait(PATIENCE)
        assert daemon.proc.returncode == -signal.SIGKILL
        asyncio.run(_wait_gone(mcp_pids))
        assert daemon.socket.exists()  # left behind by the kill: the restart must replace the stale socket

        fake.enqueue(Reply(text("It may have finished.")))
        daemon = _Daemon(tmp_path, config, env, paths["root"])
        try:
            run = daemon.rpc("runs.get", {"run_id": run_id})["run"]
            assert run["state"] == "interrupted"
            assert [(c["call_id"], c["outcome"]) for c in run["calls"]] == \
                [(CALL_ID, {"status": "unknown", "outcome_unknown": True})]
            daemon.wait(lambda: "notes__hang" in {t["name"] for t in daemon.rpc("tools.list", {})["tools"]},
                        "the MCP tool after the restart")
            second = daemon.rpc("run.start", {"conversation": CONVERSATION, "prompt": "what happened?"})["run_id"]
            daemon.wait(lambda: daemon.rpc("runs.get", {"run_id": second})["run"]["state"] == "done",
                        "the second run")
        finally:
            daemon.stop()
        assert daemon.proc.returncode == 0

    assert len(fake.requests) == 2
    sent = fake.requests[-1].json["messages"]
    assert_every_tool_use_answered(sent)
    assert "outcome unknown" in json.dumps(sent)
    assert len((paths["notes"] / CALLS_FILE).read_text().splitlines()) == 1
    store = Store.open(paths["data"] / "relay.db")  # the daemon has exited: read what it left
    try:
        assert _terminals_in(store, run_id) == [EventType.INTERRUPTED]
        assert _terminals_in(store, second) == [EventType.DONE]
        messages = store.load_conversation(conversation_key(DAEMON_ORIGIN, CONVERSATION))["messages"]
        (answer,) = messages[2]["content"]
        assert answer["tool_use_id"] == CALL_ID and OUTCOME_UNKNOWN in json.dumps(answer["content"])
    finally:
        store.close()


def _terminals_in(store: Store, run_id: str) -> list[str]:
    return [e.type for e in store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS]
