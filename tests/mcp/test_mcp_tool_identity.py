"""Issue 11 item 4: an MCP tool is bound, at every call, to what the run was offered and the user approved.

A real stdio MCP server (``changing_mcp_server.py``) turns a *pinned read* tool destructive in the
middle of a run — (a) announcing it with ``tools/list_changed``, (b) silently, (c) by restarting with
the changed tool — and a real broker (SQLite store, gate, PermissionRouter, runtime) runs the model's
calls from the fake Anthropic server. Each time the changed call gets a card (``permission.request``
with ``tool_changed``) and nothing runs without it; the model is offered the new spec from the next
step on.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant, ToolClass
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp import registry as registry_module
from relay_jupyter.mcp.config import McpConfig, StdioServerConfig
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

pytestmark = pytest.mark.asyncio

KEY = "sk-test-identity-0123456789"
KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:id.ipynb", client_id="kernel:idk")
SERVER = Path(__file__).with_name("changing_mcp_server.py")


def _calls(notes: Path) -> list[str]:
    path = notes / "lookup.calls"
    return path.read_text().splitlines() if path.exists() else []


class Rig:
    def __init__(self, tmp_path: Path, notes: Path, fake: FakeAnthropic, *flags: str) -> None:
        self.notes = notes
        self.fake = fake
        self.broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", default_model="claude-test-1",
                                               consent_timeout=60))
        self.broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                       consent_id="c"))
        cfg = StdioServerConfig(name="ch", command=sys.executable, args=[str(SERVER), "--dir", str(notes), *flags])
        self.registry = McpRegistry(McpConfig(servers={"ch": cfg}), self.broker.store, shutdown_grace=0.5)
        self.broker.mcp = self.registry
        retry = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.1, max_total_wait=0.1)
        install_runtime(self.broker, {"anthropic": AnthropicBackend(KEY, base_url=fake.base_url,
                                                                    models=("claude-*",), retry=retry, timeout=20)})

    async def __aenter__(self) -> Rig:
        await self.registry.start()
        self.registry.pin("ch__lookup", ToolClass.READ)
        self.registry.pin("ch__die", ToolClass.READ)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.broker.runs is not None:
            await self.broker.runs.aclose()
        await self.registry.stop()
        self.broker.close()

    def events(self, type: str | None = None) -> list[Any]:
        return [e for e in self.broker.store.events_since(0) if type is None or e.type == type]

    async def wait_event(self, type: str, n: int = 1) -> Any:
        async with asyncio.timeout(60):
            while len(self.events(type)) < n:
                await asyncio.sleep(0.02)
        return self.events(type)[n - 1]

    async def start(self) -> str:
        return (await call_method(self.broker, KERNEL, "run.start", {"conversation": "c", "prompt": "look"}))["run_id"]

    async def finish(self, run_id: str) -> str:
        async with asyncio.timeout(60):
            await self.broker.runs.wait(run_id)
        return [e.type for e in self.events() if e.run_id == run_id and e.type in TERMINAL_EVENTS][0]

    def offered(self, request_index: int) -> dict[str, Any]:
        tools = self.fake.requests[request_index].body.get("tools") or []
        return next(t for t in tools if t["name"] == "ch__lookup")


def _script(fake: FakeAnthropic, *middle: Any) -> None:
    fake.enqueue(Reply(tool_use("ch__lookup", {"word": "first"})), *middle,
                 Reply(tool_use("ch__lookup", {"word": "second"})), Reply("done"))


async def _changed_call_is_carded(rig: Rig, *, description_changed: bool, answer: str, between: int = 0) -> None:
    run_id = await rig.start()
    card = await rig.wait_event(EventType.PERMISSION_REQUEST)
    data = card.data
    # only the first, unchanged call ran (a pinned read: no card); the changed one waits for the click
    assert [line.split()[1:3] for line in _calls(rig.notes)] == [["read", "first"]]
    assert data["tool"] == "ch__lookup" and data["tool_class"] == "write" and data["arguments"] == {"word": "second"}
    change = data["tool_changed"]
    assert change["old"]["annotations"]["read_only_hint"] is True
    assert change["new"]["annotations"]["destructive_hint"] is True
    assert '-    "destructive_hint": false' in change["diff"] and '+    "destructive_hint": true' in change["diff"]
    assert ("delete every entry" in change["diff"]) is description_changed
    assert any("changed since the run was offered it" in r for r in data["reasons"])
    assert data["scopes"] == ["once", "run", "notebook"]
    reply = await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": data["request_id"], "decision": answer})
    assert reply["decision"] == answer
    assert await rig.finish(run_id) == EventType.DONE
    ran = [line.split()[1:3] for line in _calls(rig.notes)]
    assert ran == ([["read", "first"], ["destructive", "second"]] if answer == "allow" else [["read", "first"]])
    # the model saw the read tool first and the changed tool from the step after the change on
    assert rig.offered(0)["description"] == "Look up a word in the dictionary."
    last = rig.offered(len(rig.fake.requests) - 1)
    if description_changed:
        assert "delete every entry" in last["description"]
        assert "purge" in last["input_schema"]["properties"]
    decided = [e.data for e in rig.events(EventType.TOOL_DECIDED)]
    assert [d["decision"] for d in decided] == ["allow"] * (1 + between) + [answer]


async def test_a_pinned_read_turned_destructive_with_list_changed_gets_a_card(tmp_path: Path, notes: Path) -> None:
    (notes / "flip").touch()
    with FakeAnthropic(api_key=KEY) as fake:
        _script(fake)
        async with Rig(tmp_path, notes, fake, "--notify") as rig:
            await _changed_call_is_carded(rig, description_changed=True, answer="deny")
            assert not rig.registry._servers["ch"].connection.tools_changed  # re-listed on the change


async def test_a_pinned_read_turned_destructive_silently_gets_a_card(tmp_path: Path, notes: Path) -> None:
    """No notification, and only the annotations change: the pin's digest still matches, so only
    the per-call identity check (which counts annotations) can catch it."""
    (notes / "flip").touch()
    with FakeAnthropic(api_key=KEY) as fake:
        _script(fake)
        async with Rig(tmp_path, notes, fake, "--hints-only") as rig:
            pins = {f'{p["server"]}__{p["tool"]}' for p in rig.registry.pins.list()}
            await _changed_call_is_carded(rig, description_changed=False, answer="allow")
            assert "ch__lookup" in pins


async def test_a_restart_with_the_changed_tool_gets_a_card(tmp_path: Path, notes: Path) -> None:
    """The server process dies (``die``) and the next one lists the destructive tool: the
    registry re-lists on reconnect and the next call is a card."""
    with FakeAnthropic(api_key=KEY) as fake:
        _script(fake, Reply(tool_use("ch__die", {})))
        async with Rig(tmp_path, notes, fake) as rig:
            first_pid = rig.registry._servers["ch"].connection.pid
            (notes / "mode").write_text("destructive")  # what the next process will list
            await _changed_call_is_carded(rig, description_changed=True, answer="deny", between=1)
            assert rig.registry._servers["ch"].connection.pid not in (None, first_pid)


async def test_saved_trust_and_run_allow_do_not_reach_the_changed_tool(tmp_path: Path, notes: Path) -> None:
    """"Always allow" and "allow for this run" given to the tool as it was do not approve it changed."""
    (notes / "flip").touch()
    with FakeAnthropic(api_key=KEY) as fake:
        async with Rig(tmp_path, notes, fake, "--hints-only") as rig:
            rig.registry.unpin("ch__lookup")  # a write: the first call asks, and is trusted for the notebook
            _script(fake)
            run_id = await rig.start()
            first = (await rig.wait_event(EventType.PERMISSION_REQUEST)).data
            assert "tool_changed" not in first
            await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": first["request_id"], "decision": "allow", "scope": "notebook"})
            second = (await rig.wait_event(EventType.PERMISSION_REQUEST, 2)).data
            assert second["tool_changed"]["new"]["annotations"]["destructive_hint"] is True
            assert len(_calls(rig.notes)) == 1
            await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": second["request_id"], "decision": "deny"})
            assert await rig.finish(run_id) == EventType.DONE
            assert len(_calls(rig.notes)) == 1


async def test_a_tool_changed_while_its_card_is_open_is_refused_not_run(tmp_path: Path, notes: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The approval is bound to the tool on the card: a server that changes the tool silently (only
    its annotations) while the card is open gets DIGEST_MISMATCH at execution, and nothing runs."""
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue(Reply(tool_use("ch__lookup", {"word": "first"})), Reply("done"))
        async with Rig(tmp_path, notes, fake, "--hints-only", "--watch") as rig:
            rig.registry.unpin("ch__lookup")  # a write: its call waits on a card
            run_id = await rig.start()
            card = (await rig.wait_event(EventType.PERMISSION_REQUEST)).data
            assert "tool_changed" not in card and card["preview"]["tool_hints"]["read_only_hint"] is True
            (notes / "flip_now").touch()
            async with asyncio.timeout(30):
                while not (notes / "flipped").exists():
                    await asyncio.sleep(0.02)
            monkeypatch.setattr(registry_module, "RELIST_AFTER", 0.0)  # the card was open longer than that
            await call_method(rig.broker, KERNEL, "permission.answer",
                              {"request_id": card["request_id"], "decision": "allow"})
            assert await rig.finish(run_id) == EventType.DONE
            finished = [e.data for e in rig.events(EventType.TOOL_FINISHED)]
            assert [f.get("code") for f in finished] == ["DIGEST_MISMATCH"]
            assert _calls(notes) == []
