"""run_code through a real broker (gate, PermissionRouter, runtime, kernel bridge) and FakeAnthropic:
approved one call at a time (issue 11 item 6), and a consent that times out is a timeout, never a
cancel (item 9)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

from .rig import KEY, make_backend, tool_results

KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:code.ipynb", client_id="kernel:kc")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me", user="me")

pytestmark = pytest.mark.asyncio


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def _broker(fake: FakeAnthropic, **config: Any) -> Broker:
    broker = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1", **config))
    broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    install_runtime(broker, {"anthropic": make_backend("anthropic", fake)})
    return broker


def _events(broker: Broker, type: str | None = None) -> list[Any]:
    return [e for e in broker.store.events_since(0) if type is None or e.type == type]


async def _wait(broker: Broker, type: str, n: int = 1) -> Any:
    async with asyncio.timeout(30):
        while len(_events(broker, type)) < n:
            await asyncio.sleep(0.01)
    return _events(broker, type)[n - 1]


async def _answer_kernel_tool(broker: Broker, n: int, output: str) -> dict[str, Any]:
    """Play the kernel: answer the n-th kernel.tool_request as the originating kernel would."""
    request = (await _wait(broker, EventType.KERNEL_TOOL_REQUEST, n)).data
    broker.kernel_bridge.deliver(KERNEL, request["request_id"], output, False)
    return request


async def _terminal(broker: Broker, run_id: str) -> str:
    async with asyncio.timeout(30):
        await broker.runs.wait(run_id)
    return [e.type for e in _events(broker) if e.run_id == run_id and e.type in TERMINAL_EVENTS][0]


async def _start(broker: Broker, mode: str = "ask") -> str:
    return (await call_method(broker, KERNEL, "run.start", {"conversation": "c", "prompt": "go",
                                                             "mode": mode}))["run_id"]


async def test_run_code_offers_once_only_and_refuses_wider_answers(fake) -> None:
    broker = _broker(fake)
    fake.enqueue(Reply(tool_use("run_code", {"code": "x = 1"})), Reply(tool_use("run_code", {"code": "x = 2"})),
                 Reply("done"))
    run_id = await _start(broker)
    card = (await _wait(broker, EventType.PERMISSION_REQUEST)).data
    assert card["tool"] == "run_code" and card["scopes"] == ["once"] and card["arguments"] == {"code": "x = 1"}
    for caller, scope in ((KERNEL, "run"), (KERNEL, "notebook"), (BROWSER, "run")):
        with pytest.raises(Refusal) as info:
            await call_method(broker, caller, "permission.answer",
                              {"request_id": card["request_id"], "decision": "allow", "scope": scope})
        assert info.value.code.value == "WIDENING_REFUSED"
    assert _events(broker, EventType.KERNEL_TOOL_REQUEST) == []  # nothing ran on a refused answer
    await call_method(broker, KERNEL, "permission.answer", {"request_id": card["request_id"], "decision": "allow"})
    ran = await _answer_kernel_tool(broker, 1, "ok")
    assert ran["arguments"] == {"code": "x = 1"}
    second = (await _wait(broker, EventType.PERMISSION_REQUEST, 2)).data  # the next call asks again
    assert second["arguments"] == {"code": "x = 2"} and second["scopes"] == ["once"]
    await call_method(broker, KERNEL, "permission.answer", {"request_id": second["request_id"], "decision": "deny"})
    assert await _terminal(broker, run_id) == EventType.DONE
    assert len(_events(broker, EventType.KERNEL_TOOL_REQUEST)) == 1
    assert broker.store.list_trust() == []


async def test_full_mode_runs_run_code_without_a_card(fake) -> None:
    broker = _broker(fake)
    fake.enqueue(Reply(tool_use("run_code", {"code": "print(42)"})), Reply("done"))
    run_id = await _start(broker, mode="full")
    request = await _answer_kernel_tool(broker, 1, "42")
    assert request["tool"] == "run_code"
    assert await _terminal(broker, run_id) == EventType.DONE
    assert _events(broker, EventType.PERMISSION_REQUEST) == []
    allowed = [r for r in broker.audit.tail(20) if r.tool == "run_code" and r.decision == "allow"]
    assert [r.answered_by for r in allowed] == ["mode:full"]


async def test_a_consent_that_times_out_emits_the_timeout_and_one_resolved(fake) -> None:
    broker = _broker(fake, consent_timeout=0.3)
    fake.enqueue(Reply(tool_use("run_code", {"code": "import os"})), Reply("done"))
    run_id = await _start(broker)
    assert await _terminal(broker, run_id) == EventType.DONE
    permission = [(e.type, e.data.get("decision")) for e in _events(broker) if e.type.startswith("permission")]
    assert permission == [(EventType.PERMISSION_REQUEST, None), (EventType.PERMISSION_TIMEOUT, None),
                          (EventType.PERMISSION_RESOLVED, "timeout")]
    decided = [e.data for e in _events(broker, EventType.TOOL_DECIDED)]
    assert [(d["decision"], d.get("code")) for d in decided] == [("deny", "PERMISSION_TIMEOUT")]
    assert _events(broker, EventType.KERNEL_TOOL_REQUEST) == []
    results = tool_results(fake.requests[-1].body)
    assert len(results) == 1 and results[0][2] is True and "PERMISSION_TIMEOUT" in results[0][1]
