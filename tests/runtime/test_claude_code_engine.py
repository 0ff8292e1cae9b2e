"""The claude-code engine with the REAL ``claude`` CLI bundled in the claude-agent-sdk wheel, against the
shipped fake Anthropic server, reached only through relay's own Anthropic endpoint (the broker forwards with
its key; the CLI holds a per-run key). Marked ``peer``; skipped without the extra.

Nothing may leave the machine: the tests run only in a network namespace of their own (``unshare -n``, lo
up) — ``make test-claude-code`` runs them that way; outside one they skip.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .claude_code_rig import fake  # noqa: F401  (the fixture)

pytest.importorskip("claude_agent_sdk")

KEY = "sk-ant-broker-key-claude-code-0123456789"
NB = Caller(kind=CallerKind.KERNEL, origin="notebook:cc.ipynb", client_id="kernel:cc1")
MODEL = "claude-fake-1"


def _isolated() -> bool:
    """True inside a network namespace with only loopback (``unshare -n``): no route out."""
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
        ifaces = {line.split()[0] for line in Path("/proc/net/dev").read_text().splitlines()[2:]
                  if line.strip()}
    except OSError:
        return False
    return not routes and {i.rstrip(":") for i in ifaces} <= {"lo"}


pytestmark = [pytest.mark.peer, pytest.mark.asyncio,
              pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")]


@pytest.fixture
def rig(tmp_path, fake):
    root = tmp_path / "root"
    root.mkdir()
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_rsa").write_text("PRIVATE KEY MATERIAL\n")
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code"))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=root)
    yield broker, root  # each test stops the components in its own loop (_close)


async def _close(broker: Broker) -> None:
    from .claude_code_rig import close

    await close(broker)  # the components, the engine endpoint and the MCP gateway's listener


def events(broker: Broker, run_id: str, type_: str | None = None) -> list:
    return [e for e in broker.store.events_since(0) if e.run_id == run_id and (type_ is None or e.type == type_)]


async def terminal(broker: Broker, run_id: str) -> str:
    await asyncio.wait_for(broker.runs.wait(run_id), 120)
    ends = [e.type for e in events(broker, run_id) if e.type in TERMINAL_EVENTS]
    assert len(ends) == 1, ends  # exactly one terminal event
    return ends[0]


def workspace(broker: Broker, conversation: str) -> Path:
    return broker.workspace_tools.manager.for_conversation(conversation_key(NB.origin, conversation)).root


async def answer(broker: Broker, decision: str) -> dict:
    async with asyncio.timeout(90):
        while True:
            store = broker.store.events_since(0)
            answered = {e.data["request_id"] for e in store if e.type == EventType.PERMISSION_RESOLVED}
            open_ = [e.data for e in store if e.type == EventType.PERMISSION_REQUEST
                     and e.data["request_id"] not in answered]
            if open_:
                await call_method(broker, NB, "permission.answer",
                                  {"request_id": open_[0]["request_id"], "decision": decision, "scope": "once"})
                return open_[0]
            await asyncio.sleep(0.05)


def tool_results(fake: FakeAnthropic) -> list[dict]:
    """The tool_result blocks the CLI sent back to the model, in order."""
    out = []
    for request in fake.requests:
        for message in (request.body or {}).get("messages") or []:
            content = message.get("content")
            if isinstance(content, list):
                out += [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


def result_text(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content)


async def test_read_in_the_workspace_runs_without_a_card_and_requests_go_through_relay(rig, fake):
    broker, _ = rig
    try:
        ws = workspace(broker, "c1")
        (ws / "notes.txt").write_text("the answer is 42\n")
        fake.enqueue(Reply(text("Reading."), tool_use("Read", {"file_path": str(ws / "notes.txt")})),
                     Reply("It says 42."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "read notes.txt"}))[
            "run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not events(broker, run_id, EventType.PERMISSION_REQUEST)  # a read: no card
        (block,) = [b for b in tool_results(fake)]
        assert "the answer is 42" in result_text(block) and not block.get("is_error")
        decided = [e.data for e in events(broker, run_id, EventType.TOOL_DECIDED)]
        assert [d["decision"] for d in decided] == ["allow"]
        finished = [e.data for e in events(broker, run_id, EventType.TOOL_FINISHED)]
        assert len(finished) == 1 and not finished[0]["is_error"]  # the outcome came back from PostToolUse
        assert "It says 42." in "".join(e.data["text"] for e in events(broker, run_id, EventType.TEXT_DELTA))
        # every model request reached the upstream (which accepts only the broker's key: FakeAnthropic(api_key=KEY))
        # through relay's endpoint, where the gate charged and audited it for this notebook
        assert len(fake.requests) == 2
        proxied = [r for r in broker.audit.tail(1000, origin=NB.origin) if r.tool.startswith("model:")]
        assert len(proxied) >= 2, proxied
        assert not any(r.decision == "deny" for r in proxied)
        history = broker.runs.conversations.load_conversation(conversation_key(NB.origin, "c1"))
        assert "It says 42." in str(history["messages"])
    finally:
        await _close(broker)


async def test_read_of_a_credential_outside_the_workspace_is_refused(rig, fake):
    broker, root = rig
    try:
        secret = root / ".ssh" / "id_rsa"
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(secret)})), Reply("Could not read it."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "c2", "prompt": "read the key"}))[
            "run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not events(broker, run_id, EventType.PERMISSION_REQUEST)  # refused outright, no card
        (block,) = tool_results(fake)
        assert block.get("is_error") and "credential" in result_text(block)
        assert "PRIVATE KEY MATERIAL" not in str([r.body for r in fake.requests])
        decided = [e.data for e in events(broker, run_id, EventType.TOOL_DECIDED)]
        assert [d["decision"] for d in decided] == ["deny"] and decided[0]["code"] == "PATH_REFUSED"
    finally:
        await _close(broker)


async def test_bash_asks_approve_runs_it_deny_reaches_the_model_and_nothing_ran(rig, fake):
    broker, _ = rig
    try:
        ws = workspace(broker, "c3")
        marker_ok, marker_no = ws / "approved.txt", ws / "denied.txt"
        fake.enqueue(Reply(tool_use("Bash", {"command": f"echo yes > {marker_ok}", "description": "write"})),
                     Reply("Done."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "c3", "prompt": "run it"}))["run_id"]
        card = await answer(broker, "allow")
        assert f"echo yes > {marker_ok}" in str(card)  # the exact command is on the card
        assert await terminal(broker, run_id) == EventType.DONE
        assert marker_ok.read_text().strip() == "yes"

        fake.enqueue(Reply(tool_use("Bash", {"command": f"echo no > {marker_no}", "description": "write"})),
                     Reply("It was denied."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "c3", "prompt": "again"}))["run_id"]
        card = await answer(broker, "deny")
        assert f"echo no > {marker_no}" in str(card)
        assert await terminal(broker, run_id) == EventType.DONE
        assert not marker_no.exists()  # nothing ran
        denied = tool_results(fake)[-1]
        assert denied.get("is_error") and "relay refused" in result_text(denied)  # the model read the denial
    finally:
        await _close(broker)


async def test_write_outside_the_workspace_is_refused_even_in_full_mode(rig, fake):
    broker, root = rig
    try:
        target = root / "project.py"
        fake.enqueue(Reply(tool_use("Write", {"file_path": str(target), "content": "print('pwned')\n"})),
                     Reply("Refused."))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "c4", "prompt": "write it", "mode": "full"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not target.exists()
        (block,) = tool_results(fake)
        assert block.get("is_error") and "outside the scratch workspace" in result_text(block)
        # inside the workspace the same tool is contained: it runs in full mode without a card
        ws = workspace(broker, "c4")
        fake.enqueue(Reply(tool_use("Write", {"file_path": str(ws / "ok.py"), "content": "x = 1\n"})),
                     Reply("Written."))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "c4", "prompt": "write in ws", "mode": "full"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert (ws / "ok.py").read_text() == "x = 1\n"
    finally:
        await _close(broker)


async def test_cancel_kills_the_cli_and_its_children_with_one_terminal_event(rig, fake):
    broker, _ = rig
    try:
        tag = str(1000 + secrets.randbelow(8000))
        # (the CLI itself blocks a standalone `sleep`: a long-running python child instead)
        marker = f"time.sleep(3{tag})"
        # (and one that ignores SIGTERM and SIGHUP: only the engine's SIGKILL of the session stops it)
        fake.enqueue(Reply(tool_use("Bash", {"command": "( /usr/bin/python3 -c 'import signal, time; "
                                                        "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                                        f"signal.signal(signal.SIGHUP, signal.SIG_IGN); {marker}' & ); "
                                                        "/usr/bin/python3 -c 'import time; time.sleep(600)'",
                                             "description": "wait"})), Reply("late"))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "c5", "prompt": "sleep", "mode": "full"}))["run_id"]

        def sleepers() -> list[int]:
            found = []
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    except OSError:
                        continue
                    if marker.encode() in cmd and state != "Z":
                        found.append(int(pid))
            return found

        try:
            async with asyncio.timeout(90):
                while not sleepers():
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(([(e.type, e.data) for e in events(broker, run_id)],
                                  [r.body.get("messages")[-1] for r in fake.requests if r.body])) from None
        assert (await call_method(broker, NB, "run.cancel", {"run_id": run_id})) == {"cancelled": True}
        assert await terminal(broker, run_id) == EventType.CANCELLED
        assert sleepers() == []  # the command the CLI started is gone
        started = [e for e in events(broker, run_id, EventType.TOOL_STARTED)]
        assert len(started) == 1
    finally:
        await _close(broker)


async def test_cancel_kills_what_a_bash_command_daemonised(rig, fake):
    """A ``Bash`` command that escapes on purpose — ``setsid`` (a session of its own), ``setsid -f`` (a fork that
    leaves its parent at once), ``nohup ... &`` and a plain ``sleep 300 &``, each re-parented away from the shell as
    soon as the command returns — leaves nothing alive after a cancel: the launcher is the CLI's child subreaper,
    so every one of them stays in its tree, and the engine kills the whole tree."""
    broker, _ = rig
    try:
        tag = str(1000 + secrets.randbelow(8000))
        py = "/usr/bin/python3 -c 'import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep({})'"
        escapes = [f"setsid {py.format('31' + tag)} >/dev/null 2>&1 < /dev/null &",
                   f"setsid -f {py.format('32' + tag)} >/dev/null 2>&1 < /dev/null",
                   f"nohup {py.format('33' + tag)} >/dev/null 2>&1 &",
                   f"sleep 34{tag} >/dev/null 2>&1 &"]
        markers = [f"time.sleep(3{n}{tag})".encode() for n in (1, 2, 3)] + [f"34{tag}".encode()]
        command = " ".join(escapes) + " /usr/bin/python3 -c 'import time; time.sleep(600)'"
        fake.enqueue(Reply(tool_use("Bash", {"command": command, "description": "daemonise"})), Reply("late"))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "c6", "prompt": "daemonise", "mode": "full"}))["run_id"]

        def escaped() -> dict[bytes, int]:
            found = {}
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    except OSError:
                        continue
                    for m in markers:
                        if m in cmd.replace(b"\0", b" ") and state != "Z":
                            found[m] = int(pid)
            return found

        async with asyncio.timeout(90):
            while len(escaped()) < len(markers):
                await asyncio.sleep(0.1)
        sessions = {os.getsid(pid) for pid in escaped().values()}
        assert len(sessions) >= 3  # they really left the command's session (setsid twice, and the shell's own)
        assert (await call_method(broker, NB, "run.cancel", {"run_id": run_id})) == {"cancelled": True}
        assert await terminal(broker, run_id) == EventType.CANCELLED
        assert escaped() == {}  # nothing the command daemonised survived the cancel
    finally:
        await _close(broker)


async def test_missing_pieces_fail_in_one_line(tmp_path, fake):
    broker = Broker.open(BrokerConfig(in_memory=True, default_model=MODEL))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=tmp_path)
    try:
        with pytest.raises(Refusal) as info:
            await call_method(broker, NB, "run.start", {"conversation": "c", "prompt": "p", "engine": "claude-code"})
        assert info.value.code.value == "NO_ENGINE"
        assert "\n" not in info.value.message and "workspace" in info.value.message
    finally:
        await _close(broker)
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "r2", default_model=MODEL))
    install_components(broker, jupyter_root=tmp_path, backends={})
    try:
        with pytest.raises(Refusal) as info:
            await call_method(broker, NB, "run.start", {"conversation": "c", "prompt": "p", "engine": "claude-code"})
        assert info.value.code.value == "NO_CREDENTIALS" and "\n" not in info.value.message
        assert "Anthropic" in info.value.message
    finally:
        await _close(broker)
