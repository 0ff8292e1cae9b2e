"""Shared parts of the claude-code engine tests that run the REAL bundled ``claude`` CLI against the shipped
``FakeAnthropic`` (through relay's own Anthropic endpoint). They run only in a network namespace of their
own (``unshare -n``, lo up: ``make test-claude-code``); outside one they skip.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401  (imported now, see below)
import pytest

from relay_jupyter.broker.assembly import stop_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply

# hypothesis' pytest plugin imports hypothesis at the session's end when no test did; after these tests, on
# CPython 3.11.7, assertion-rewriting it has died with "SystemError: AST constructor recursion depth
# mismatch" (2 of 6 runs), failing a green session. Importing it here keeps that parse out of the end.

KEY = "sk-ant-broker-key-claude-code-0123456789"
NB = Caller(kind=CallerKind.KERNEL, origin="notebook:cc.ipynb", client_id="kernel:cc1")
MODEL = "claude-fake-1"


def isolated() -> bool:
    """True inside a network namespace with only loopback (``unshare -n``): no route out."""
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
        ifaces = {line.split()[0] for line in Path("/proc/net/dev").read_text().splitlines()[2:]
                  if line.strip()}
    except OSError:
        return False
    return not routes and {i.rstrip(":") for i in ifaces} <= {"lo"}


ONLY_ISOLATED = pytest.mark.skipif(not isolated(), reason="run in a network namespace: make test-claude-code")


async def close(broker: Broker) -> None:
    from relay_jupyter.broker.mcp_gateway import mcp_gateway_of

    await stop_components(broker)
    endpoint = getattr(broker, "engine_endpoint", None)
    if endpoint is not None:
        await endpoint.aclose()
    await mcp_gateway_of(broker).aclose()  # the engine's runs started its loopback listener


def events(broker: Broker, run_id: str, type_: str | None = None) -> list:
    return [e for e in broker.store.events_since(0) if e.run_id == run_id and (type_ is None or e.type == type_)]


async def terminal(broker: Broker, run_id: str) -> str:
    await asyncio.wait_for(broker.runs.wait(run_id), 120)
    ends = [e.type for e in events(broker, run_id) if e.type in TERMINAL_EVENTS]
    assert len(ends) == 1, ends  # exactly one terminal event
    return ends[0]


def terminal_data(broker: Broker, run_id: str) -> dict[str, Any]:
    (end,) = [e for e in events(broker, run_id) if e.type in TERMINAL_EVENTS]
    return dict(end.data)


def workspace(broker: Broker, conversation: str, origin: str = NB.origin) -> Path:
    return broker.workspace_tools.manager.for_conversation(conversation_key(origin, conversation)).root


async def open_request(broker: Broker, run_id: str | None = None) -> dict[str, Any]:
    """The first permission request not yet resolved (waits for one)."""
    async with asyncio.timeout(90):
        while True:
            store = broker.store.events_since(0)
            answered = {e.data["request_id"] for e in store if e.type == EventType.PERMISSION_RESOLVED}
            open_ = [e.data for e in store if e.type == EventType.PERMISSION_REQUEST
                     and e.data["request_id"] not in answered and (run_id is None or e.run_id == run_id)]
            if open_:
                return open_[0]
            await asyncio.sleep(0.05)


async def answer(broker: Broker, decision: str, caller: Caller = NB) -> dict[str, Any]:
    request = await open_request(broker)
    await call_method(broker, caller, "permission.answer",
                      {"request_id": request["request_id"], "decision": decision, "scope": "once"})
    return request


def tool_results(fake: FakeAnthropic) -> list[dict]:
    """The tool_result blocks the CLI sent back to the model, in order (each once: the CLI resends its
    whole history, so a later request repeats earlier results)."""
    out: list[dict] = []
    seen: set[str] = set()
    for request in fake.requests:
        for message in (request.body or {}).get("messages") or []:
            content = message.get("content")
            if isinstance(content, list):
                for b in content:
                    if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") not in seen:
                        seen.add(b.get("tool_use_id"))
                        out.append(b)
    return out


def result_text(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content)


def processes_under(directory: Path) -> list[int]:
    """Live processes whose working directory or command line lies under ``directory`` (the CLI runs in
    the conversation's workspace; its commands start there)."""
    found = []
    prefix = str(directory)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if state not in ("Z", "X") and (cwd.startswith(prefix) or prefix in cmd):
            found.append(int(entry))
    return found


@pytest.fixture
def fake():
    """The fake Anthropic upstream of a test (the broker's key; unscripted requests get a fixed reply).
    Import it into a test module to use it (``from .claude_code_rig import fake``)."""
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as server:
        yield server

