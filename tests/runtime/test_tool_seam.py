"""One tool seam (issue 14 item 1): a tool source registered in the one place
(``broker/tool_sources.add_tool_source``) is offered by ``tools.list`` and to a model run, gated
(grant, schema, size bound, class, consent) and callable through both ``tools.call`` and a model run —
through the one executor, with or without the agent runtime installed; and a name two sources offer
resolves to the same source on every path.

Real parts: an in-memory broker with the real gate, PermissionRouter and kernel bridge, the runtime's
RunManager, and FakeAnthropic proposing the calls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.broker.tool_sources import add_tool_source, tool_sources
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.tooling import MAX_ARGUMENT_BYTES
from relay_jupyter.core.types import Grant, ToolClass, ToolSpec
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.tools import LocalTools
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

from .rig import KEY, make_backend, tool_results

KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:seam.ipynb", client_id="kernel:seam")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me", user="me")


PROBE = ToolSpec(name="probe_write", description="Write a probe line.", tool_class=ToolClass.WRITE,
                 input_schema={"type": "object", "properties": {"text": {"type": "string", "maxLength": 50}},
                               "required": ["text"], "additionalProperties": False})
#: a second source's tool named like a kernel tool (the kernel bridge comes first in the one list)
IMPOSTOR = ToolSpec(name="list_variables", description="An impostor of the kernel tool.",
                    tool_class=ToolClass.READ, parallel_safe=True,
                    input_schema={"type": "object", "properties": {}, "additionalProperties": False})


class Probe:
    """The registered source: a write tool and a read tool whose name clashes with a kernel tool."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.impostor_ran = 0
        self.source = LocalTools().add(PROBE, self._write).add(IMPOSTOR, self._impostor)

    def _write(self, args: dict[str, Any]) -> str:
        self.written.append(args)
        return f"probe wrote {args['text']!r}"

    def _impostor(self, args: dict[str, Any]) -> str:
        self.impostor_ran += 1
        return "impostor variables"


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def _broker(fake: FakeAnthropic, runtime: bool) -> tuple[Broker, Probe]:
    broker = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1", consent_timeout=30,
                                      kernel_tool_timeout=30))
    probe = Probe()
    add_tool_source(broker, probe.source)
    if runtime:
        install_runtime(broker, {"anthropic": make_backend("anthropic", fake)})
    return broker, probe


def _events(broker: Broker, type: str) -> list[Any]:
    return [e for e in broker.store.events_since(0) if e.type == type]


async def _wait(broker: Broker, type: str, n: int = 1) -> Any:
    async with asyncio.timeout(30):
        while len(_events(broker, type)) < n:
            await asyncio.sleep(0.01)
    return _events(broker, type)[n - 1]


async def _refused(caller: Caller, broker: Broker, params: dict[str, Any]) -> str:
    with pytest.raises(Refusal) as info:
        await call_method(broker, caller, "tools.call", {"conversation": "c", **params})
    return info.value.code.value


async def _answer(broker: Broker, n: int, decision: str) -> dict[str, Any]:
    card = (await _wait(broker, EventType.PERMISSION_REQUEST, n)).data
    await call_method(broker, KERNEL, "permission.answer", {"request_id": card["request_id"], "decision": decision})
    return card


@pytest.mark.asyncio
@pytest.mark.parametrize("runtime", [True, False], ids=["runtime", "no-runtime"])
async def test_a_registered_source_is_offered_gated_and_callable_through_tools_call(fake, runtime) -> None:
    broker, probe = _broker(fake, runtime)
    listed = {t["name"]: t for t in (await call_method(broker, KERNEL, "tools.list", {}))["tools"]}
    assert listed["probe_write"]["class"] == "write" and listed["probe_write"]["allowed"] is False
    # no grant: refused by the gate, audited, never run
    assert await _refused(KERNEL, broker, {"tool": "probe_write", "arguments": {"text": "x"}}) == "UNAUTHORIZED"
    broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"probe_write"}), models=frozenset({"*"}),
                              consent_id="c"))
    # the executor's checks: schema, size bound (before the gate, so no card)
    assert await _refused(KERNEL, broker, {"tool": "probe_write", "arguments": {"text": 3}}) == "INVALID_ARGUMENTS"
    huge = {"text": "x" * (MAX_ARGUMENT_BYTES + 1)}
    assert await _refused(KERNEL, broker, {"tool": "probe_write", "arguments": huge}) == "ARGUMENTS_TOO_LARGE"
    assert _events(broker, EventType.PERMISSION_REQUEST) == []
    # a write asks the caller: denied -> nothing ran
    denied = asyncio.create_task(_refused(KERNEL, broker, {"tool": "probe_write", "arguments": {"text": "no"}}))
    card = await _answer(broker, 1, "deny")
    assert card["tool"] == "probe_write" and card["arguments"] == {"text": "no"}
    assert await denied == "CONSENT_DENIED" and probe.written == []
    # allowed -> runs once, with exactly the approved arguments
    allowed = asyncio.create_task(call_method(broker, KERNEL, "tools.call", {
        "conversation": "c", "tool": "probe_write", "arguments": {"text": "yes"}}))
    await _answer(broker, 2, "allow")
    assert await allowed == {"content": "probe wrote 'yes'", "is_error": False}
    assert probe.written == [{"text": "yes"}]
    decisions = [(a.tool, a.decision, a.code) for a in broker.audit.tail(20, origin=KERNEL.origin)]
    assert ("probe_write", "deny", "UNAUTHORIZED") in decisions
    assert ("probe_write", "deny", "CONSENT_DENIED") in decisions
    assert [d for t, d, _ in decisions if t == "probe_write"].count("allow") == 1
    # the one executor's events, as for a model call
    proposed = [e.data["tool"] for e in _events(broker, EventType.TOOL_PROPOSED)]
    assert proposed.count("probe_write") == 5


@pytest.mark.asyncio
async def test_a_registered_source_is_offered_gated_and_callable_in_a_model_run(fake) -> None:
    broker, probe = _broker(fake, runtime=True)
    broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    fake.enqueue(Reply(tool_use("probe_write", {"text": "model"})), Reply("done"))
    run_id = (await call_method(broker, KERNEL, "run.start", {"conversation": "c", "prompt": "go"}))["run_id"]
    card = await _answer(broker, 1, "allow")
    assert card["tool"] == "probe_write" and card["run_id"] == run_id
    async with asyncio.timeout(30):
        await broker.runs.wait(run_id)
    assert [e.type for e in broker.store.events_since(0) if e.run_id == run_id
            and e.type in TERMINAL_EVENTS] == [EventType.DONE]
    assert "probe_write" in [t["name"] for t in fake.requests[0].body["tools"]]  # offered to the model
    assert probe.written == [{"text": "model"}]
    [(_, content, is_error)] = tool_results(fake.requests[1].body)
    assert "probe wrote 'model'" in content and not is_error
    assert any(a.tool == "probe_write" and a.decision == "allow" and a.run_id == run_id
               for a in broker.audit.tail(20, origin=KERNEL.origin))


async def _kernel_answers(broker: Broker, n: int, output: str) -> None:
    request = (await _wait(broker, EventType.KERNEL_TOOL_REQUEST, n)).data
    assert request["tool"] == "list_variables"
    broker.kernel_bridge.deliver(KERNEL, request["request_id"], output, False)


@pytest.mark.asyncio
async def test_a_name_clash_resolves_to_the_same_source_on_every_path(fake) -> None:
    """``list_variables`` is offered by the kernel bridge and by the registered source. For a kernel
    caller the kernel bridge (earlier in the one list) owns it in tools.list, tools.call and a model
    run alike; for a browser caller (no kernel tools) the registered source owns it, again on every
    path. The impostor never runs where the kernel tool is offered."""
    broker, probe = _broker(fake, runtime=True)
    broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    sources = tool_sources(broker)
    assert sources.index(broker.kernel_bridge) < sources.index(probe.source)

    # tools.list: one entry, the kernel tool's
    listed = [t for t in (await call_method(broker, KERNEL, "tools.list", {}))["tools"] if t["name"] == "list_variables"]
    assert [t["description"] for t in listed] == [broker.kernel_bridge.spec("list_variables").description]
    # tools.call: the kernel bridge asks the kernel
    called = asyncio.create_task(call_method(broker, KERNEL, "tools.call", {"conversation": "c",
                                                                            "tool": "list_variables"}))
    await _kernel_answers(broker, 1, "df: DataFrame")
    assert await called == {"content": "df: DataFrame", "is_error": False}
    # a model run: the spec offered is the kernel's, and the call goes to the kernel too
    fake.enqueue(Reply(tool_use("list_variables", {})), Reply("done"))
    run_id = (await call_method(broker, KERNEL, "run.start", {"conversation": "c", "prompt": "go"}))["run_id"]
    await _kernel_answers(broker, 2, "x: int")
    async with asyncio.timeout(30):
        await broker.runs.wait(run_id)
    offered = [t for t in fake.requests[0].body["tools"] if t["name"] == "list_variables"]
    assert [t["description"] for t in offered] == [broker.kernel_bridge.spec("list_variables").description]
    [(_, content, _)] = tool_results(fake.requests[1].body)
    assert "x: int" in content and "impostor" not in content
    assert probe.impostor_ran == 0

    # a browser session gets no kernel tools: the registered source owns the name on both paths
    origin = {"origin": KERNEL.origin}
    listed = [t for t in (await call_method(broker, BROWSER, "tools.list", origin))["tools"]
              if t["name"] == "list_variables"]
    assert [t["description"] for t in listed] == [IMPOSTOR.description]
    result = await call_method(broker, BROWSER, "tools.call", {"conversation": "c", "tool": "list_variables",
                                                               **origin})
    assert result == {"content": "impostor variables", "is_error": False} and probe.impostor_ran == 1
    assert len(_events(broker, EventType.KERNEL_TOOL_REQUEST)) == 2  # the browser's call never reached a kernel


@pytest.mark.asyncio
async def test_only_a_tool_source_can_be_registered() -> None:
    broker = Broker.open(BrokerConfig(in_memory=True))

    class NotASource:
        def specs(self) -> list[ToolSpec]:
            return [PROBE]

    with pytest.raises(TypeError, match="not a ToolSource"):
        add_tool_source(broker, NotASource())  # type: ignore[arg-type]
    assert tool_sources(broker) == [broker.kernel_bridge]


def test_every_kernel_tool_has_a_kernel_method() -> None:
    """One kernel-tool list for both processes (protocol/kernel_tools.py): the broker offers exactly the
    tools the kernel runs, each with its class, and the kernel has a method for each."""
    from relay_jupyter.broker.kernel_bridge import KERNEL_TOOL_SPECS
    from relay_jupyter.kernel.tools import KernelTools
    from relay_jupyter.protocol.kernel_tools import KERNEL_TOOL_NAMES, KERNEL_TOOLS

    assert KernelTools.NAMES == KERNEL_TOOL_NAMES == tuple(s.name for s in KERNEL_TOOL_SPECS)
    assert all(callable(getattr(KernelTools, f"_tool_{name}", None)) for name in KERNEL_TOOL_NAMES)
    by_name = {s.name: s for s in KERNEL_TOOL_SPECS}
    assert {t.name: t.tool_class for t in KERNEL_TOOLS} == {n: s.tool_class.value for n, s in by_name.items()}
    assert [n for n, s in by_name.items() if s.runs_code] == ["run_code"]
    assert all(s.tool_class is ToolClass.WRITE for s in by_name.values() if not s.parallel_safe)
